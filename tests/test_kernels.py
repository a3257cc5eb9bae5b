"""The kernel-name classifier, name by name: GEMM/conv or not, and on which units it runs.

The names are real: each one was seen in a trace of the shared corpus (H100 pairs with torch 2.11 and
cuBLAS 13, V100/A100/H100 traces from HTA, Kineto, TraceLens and PARAM, AMD MI300 traces), cut at the
parameter list where that is long. Every Tensor Core and SIMT token of `analyzer/kernels.py` is in the
table at least once, and so is every exclusion.
"""

from __future__ import annotations

import pytest

from gpuadvise.analyzer.model.kernels import head, is_matmul_like, precision_class

NOT = None  # not a GEMM/conv kernel
TABLE = [
    # --- cuBLAS 13 on an H100 (the tf32 pair): `xmma` and `sm80_` say nothing, `ffma` says CUDA cores
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize256x128x8_stage3_warpsize4x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas", "fp32-simt"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas", "fp32-simt"),
    ("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize128x32x8_stage3_warpsize2x2x1_g1_ffma_aligna4_alignc4_execute_kernel__5x_cudnn", "fp32-simt"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nt_align1>(cutlass_80_simt_sgemm_256x128_8x4_nt_align1::Params)", "fp32-simt"),
    ("void sgemm_largek_lds64<true, false, 5, 5, 4, 4, 4, 34>(float*, float const*, float const*, int, int, int, int, int, int)", "fp32-simt"),
    # --- the same GEMMs with TF32 (tf32 in the operand types) and with bf16 autocast (nvjet)
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas", "tensor-core"),
    ("sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_warpgroupsize1x1x1_g1_execute_segment_k_on_kernel__5x_cudnn", "tensor-core"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "tensor-core"),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x256x32_warpgroupsize2x1x1_g1_execute_segment_k_off_kernel__5x_cudnn", "tensor-core"),
    ("sm80_xmma_wgrad_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize32x128x32_stage4_warpsize1x4x1_g1_tensor16x8x16_execute_kernel__5x_cudnn", "tensor-core"),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x64x32_stage5_warpsize2x2x1_g1_tensor16x8x8_execute_kernel__5x_cudnn", "tensor-core"),
    # the unaligned bf16 GEMMs of the align pair: Tensor Cores, in a slow sm75-era align1 kernel
    ("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_tn_align1>(cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_tn_align1::Params)", "tensor-core"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align2>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align2::Params)", "tensor-core"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)", "tensor-core"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8>(cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8::Params)", "tensor-core"),
    ("ampere_tf32_s1688gemm_64x64_nn", "tensor-core"),
    ("volta_h884gemm_64x64_ldg8_nn", "tensor-core"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", "tensor-core"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "tensor-core"),
    # attention: cuDNN/flash/mem-efficient kernels (f32 mem-efficient attention on sm80+ uses 3xTF32)
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0", "tensor-core"),
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>>(Flash_fwd_params)", "tensor-core"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)", "tensor-core"),
    ("fmha_cutlassB_f32_aligned_64x64_k64_sm75(PyTorchMemEffAttention::AttentionBackwardKernel<cutlass::arch::Sm75, float>::Params)", "fp32-simt"),
    # cuDNN fp32 engines and the V100 sgemm family: CUDA cores
    ("volta_sgemm_128x64_nn", "fp32-simt"),
    ("ampere_sgemm_128x64_nn", "fp32-simt"),
    ("volta_scudnn_128x64_relu_interior_nn_v1", "fp32-simt"),
    ("volta_gcgemm_32x32_nt", "fp32-simt"),
    ("void implicit_convolve_sgemm<float, float, 1024, 5, 5, 3, 3, 3, 1, false, false, true>(int, int, int, float const*, int, float*)", "fp32-simt"),
    ("void cudnn::cnn::wgrad_alg0_engine<float, 128, 5, 5, 3, 3, 3, false, 512>(int, int, int, float const*, int, float*)", "fp32-simt"),
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int, float const*, int, float*)", "fp32-simt"),
    ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::WinogradDataParams<float, float>)", "fp32-simt"),
    ("void fft2d_r2c_32x32<float, false, 0u, false>(float2*, float const*, int, int, int, int, int, int, int, int, int)", "fp32-simt"),
    ("void gemmSN_NN_kernel<float, 256, 4, 2, 8, 4, 4, false, cublasGemvTensorStridedBatched<float const>>(cublasGemmSmallNParams<float>)", "fp32-simt"),
    ("void magma_sgemmEx_kernel<float, float, float, false, false, 6, 3, 5, 3, 3>(int, int, int, Tensor, int)", "fp32-simt"),
    # cuDNN's direct convolution engine on bf16 data (cudnn pair, benchmark off): CUDA cores, 16-bit data
    ("void convolve_common_engine_float_NHWC<__nv_bfloat16, __nv_bfloat16, 128, 5, 5, 3, 3, 3, true, false, false, false, false>(int, int, int, __nv_bfloat16 const*)", "simt"),
    # AMD: Tensile with MFMA (MI…), CK XDL, MIOpen igemm on bf16
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x64x128_MI16x16x1_SN_LDSB1_AFC1", "tensor-core"),
    ("Cijk_Ailk_Bjlk_SB_Bias_AS_SAV_UserArgs_MT64x16x16_MI16x16x1_SN_LDSB0_AFC1", "tensor-core"),
    ("_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_34GridwiseGemmMultiD_xdl_cshuffle_v3", "tensor-core"),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_1x4x1x64_tb1x8x2x1_1x4x1x64", "tensor-core"),
    # Triton: a template's precision is decided at compile time (not in the name); fused pointwise kernels
    # that list `convolution` among the ops they sit next to are no convolution
    ("triton_tem_fused_addmm_0", "other"),
    ("triton_poi_fused__unsafe_view_add_addmm_clone_convolution_mul_native_layer_norm_7", NOT),
    ("triton_red_fused__unsafe_view_add_clone_convolution_native_layer_norm_slice_transpose_view_4", NOT),
    # next to GEMMs and convs, but no matrix math
    ("void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int)", NOT),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, float>(cublasLt::cublasSplitKParams<float>)", NOT),
    ("void splitKreduce_kernel<float, float, float, float, true, false, false>(cublasSplitKParams<float>, float const*)", NOT),
    ("void cutlass__5x_cudnn::Kernel<cutlass__5x_cudnn::reduction::kernel::ReduceSplitK<cutlass__5x_cudnn::MatrixShape<4, 256>>>(Params)", NOT),
    ("void cublasLt::epilogue::impl::globalKernel<8, 32, float, float, float, true, true, 1>(int, int, long, float*)", NOT),
    ("void cask_plugin__5x_cudnn::xmma__5x_cudnn::init_device_workspace_kernel<xmma__5x_cudnn::implicit_gemm::fprop::Params>(Params)", NOT),
    ("cask_cudnn::computeWgradBOffsetsKernel(cask_cudnn::ComputeWgradBOffsetsParams)", NOT),
    ("void cudnn::cnn::im2col4d_kernel<float, long>(cudnn::cnn::im2col4d_params, cudnnConvolutionStruct)", NOT),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, 512, true, 1>(cudnnTensorStruct, float const*)", NOT),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)0>(Params)", NOT),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 2, 2, false, false, cublasGemvParams<float>>(Params)", NOT),
    ("void dot_kernel<float, 128, 0, cublasDotParams<cublasGemvTensorStridedBatched<float const>>>(cublasDotParams<float>)", NOT),
    ("void scal_kernel<float, float, 1, true, 6, 5, 5, 3>(cublasTransposeParams<float>, float const*, float*)", NOT),
    # a GEMM word in the parameter list (fbgemm) or template arguments of an elementwise kernel is not a GEMM
    ("void bounds_check_indices_kernel<long, false>(at::GenericPackedTensorAccessor<long, 1ul>, fbgemm_gpu::BoundsCheckMode)", NOT),
    ("void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)", NOT),
    ("void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float, false, long, 2ul, 32ul>(at::GenericPackedTensorAccessor<c10::Half, 1ul>)", NOT),
    ("void at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::_float_to_hfp8_gpu(at::Tensor const&, long, long, double)::{lambda(float)#1}, at::detail::Array<char*, 2> >(int)", NOT),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>>(Params)", NOT),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", NOT),
]


@pytest.mark.parametrize("name,expected", TABLE, ids=[n[:60] for n, _ in TABLE])
def test_kernel_class(name, expected):
    if expected is NOT:
        assert not is_matmul_like(name), f"{name} is not a GEMM/conv kernel"
    else:
        assert is_matmul_like(name), f"{name} is a GEMM/conv kernel"
        assert precision_class(name) == expected


def test_head_drops_the_parameter_list_only():
    assert head("void f<a<b>, c>(int, fbgemm_gpu::x)") == "void f<a<b>, c>"
    assert head("ampere_sgemm_128x64_nn") == "ampere_sgemm_128x64_nn"
    assert head("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float>::Params)") == \
        "fmha_cutlassF_f32_aligned_64x64_rf_sm80"


# -- compiled work ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, kind", [
    ("triton_poi_fused__unsafe_view_mul_silu_2", "pointwise"),
    ("triton_red_fused_add_mean_mul_pow_rsqrt_0", "reduction"),
    ("triton_per_fused_native_layer_norm_3", "persistent reduction"),
    ("triton_tem_fused_addmm_relu_0", "template GEMM"),
    ("cpp_fused_add_relu_0", "C++ fused"),
    ("ampere_sgemm_64x64_nn", None),
    ("void at::native::vectorized_elementwise_kernel<4, triton_poi_like>", None),  # a name *containing* it
])
def test_inductor_kernels_are_named_by_kind(name, kind):
    from gpuadvise.analyzer.model.kernels import inductor_kind

    assert inductor_kind(name) == kind


@pytest.mark.parametrize("name, compiled", [
    ("Torch-Compiled Region: 0/0", True), ("CompiledFunction", True), ("CompiledFunctionBackward", True),
    ("## Call CompiledFxGraph fal4xpiah2v6", True), ("TorchDynamo Cache Lookup", False),
    ("CompiledFunctionFoo", False), ("aten::addmm", False),
])
def test_compiled_region_spans(name, compiled):
    from gpuadvise.analyzer.model.kernels import is_compiled_region

    assert is_compiled_region(name) is compiled


def test_template_gemm_is_still_a_matmul():
    # the templated GEMM Inductor generates is matrix work; its pointwise neighbours are not
    assert is_matmul_like("triton_tem_fused_mm_2")
    assert not is_matmul_like("triton_poi_fused_add_relu_0")
