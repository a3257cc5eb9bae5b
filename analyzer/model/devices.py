"""What each GPU can do, from its vendor's own numbers: the one table every prediction that depends on
the hardware reads (Tensor Core speedups, the half-precision peak a GEMM can reach, memory and PCIe
bandwidth).

Per product: dense peak throughput (TFLOP/s, no 2:4 sparsity) of fp32 on the CUDA cores / vector ALUs
("SIMT"), and of the matrix units (Tensor Cores, AMD matrix cores / MFMA) for TF32 (AMD: xf32),
bf16, fp16 (with fp32 accumulation, what autocast uses: GeForce cards run it at half their fp16-accumulate
rate) and fp8; memory bandwidth (GB/s); the PCIe generation of its host link. A dtype is None where the
product has no matrix path for it (Volta and Turing have no TF32 or bf16; Turing's T4 is told fp16, never
TF32; Pascal has no Tensor Cores at all). AMD MI250/MI250X figures are per graphics die (GCD): PyTorch
sees each as one device.

Sources (vendor datasheets and architecture whitepapers):
- Volta: NVIDIA Tesla V100 GPU Architecture whitepaper (2017) and V100 datasheet (SXM2 15.7 / fp16 TC 125;
  PCIe 14 / 112; 900 GB/s).
- Turing: NVIDIA Turing GPU Architecture whitepaper (2018): T4 8.1 / fp16 TC 65 / 320 GB/s; GeForce RTX
  2080 Ti 13.4 / fp16 with fp32 accumulate 53.8 / 616 GB/s; Quadro RTX 6000/8000 16.3 / 130.5 / 672 GB/s.
- Ampere: NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020) and A100 datasheet (19.5 / TF32 156 /
  bf16 312; 40 GB 1555 GB/s, 80 GB SXM 2039, PCIe 1935); A30 datasheet (10.3 / 82 / 165 / 933); NVIDIA
  Ampere GA102 GPU Architecture whitepaper: A10 (31.2 / 62.5 / 125 / 600), A40 (37.4 / 74.8 / 149.7 /
  696), GeForce RTX 3090 (35.6 / TF32 35.6 / fp32-accumulate 71 / 936); A10G from the AWS G5 datasheet
  (31.2 / 35 / 70 / 600).
- Ada: NVIDIA Ada GPU Architecture whitepaper (2022) and datasheets: L4 (30.3 / 60 / 121 / fp8 242.5 /
  300), L40 (90.5 / 90.5 / 181 / 362 / 864), L40S (91.6 / 183 / 362 / 733 / 864), RTX 6000 Ada (91.1 /
  182.1 / 364.2 / 728.5 / 960), GeForce RTX 4090 (82.6 / 82.6 / 165.2 / 330.3 / 1008).
- Hopper: NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022) and H100 / H200 datasheets: H100 SXM5
  66.9 / 494.7 / 989.4 / 1978.9 / 3350; H100 PCIe 51.2 / 378 / 756 / 1513 / 2000; H100 NVL 60 / 417.5 /
  835 / 1670 / 3900; H800 as H100 (SXM 3350); H200 as H100 SXM with 4800 GB/s; GH200 4000 GB/s.
- Blackwell: NVIDIA Blackwell architecture technical brief and HGX B200 / GB200 NVL72 datasheets: B200 75 /
  1100 / 2250 / 4500 / 8000; B100 60 / 875 / 1750 / 3500 / 8000; GB200 80 / 1250 / 2500 / 5000 / 8000;
  NVIDIA RTX Blackwell GPU Architecture whitepaper: GeForce RTX 5090 104.8 / 209.5 / 419 / 838 / 1792.
- AMD CDNA: AMD Instinct MI100 datasheet (CDNA, 23.1 vector fp32 / fp32 matrix 46.1 / bf16 92.3 / fp16
  184.6 / 1228); CDNA 2 white paper and MI200 datasheets (fp32 vector / fp32 matrix / bf16 = fp16 / GB/s):
  MI210 22.6 / 45.3 / 181 / 1638, MI250 per GCD 22.6 / 45.3 / 181 / 1638 (the card: 45.3 / 90.5 / 362.1),
  MI250X per GCD 23.9 / 47.9 / 191.5 / 1638 (the card: 47.9 / 95.7 / 383); CDNA 3 white paper and MI300 datasheets: MI300X 163.4 / xf32 653.7 / 1307.4 / fp8
  2614.9 / 5300, MI300A 122.6 / 490.3 / 980.6 / 1961.2 / 5300, MI325X as MI300X with 6000 GB/s.

A device is matched by its name (trace `deviceProperties` or run.json), else by its architecture
(compute capability; AMD's gfx9.0 / 9.4 on ROCm), else by the architecture its kernel names show
(`sm90_…`, `ampere_…`; AMD's Tensile kernels' `ISA942`, `gfx90a`: `from_kernels`), else it gets FALLBACK:
a stated unknown, from which no prediction takes a peak (its `vendor` still says AMD or NVIDIA where the
platform or the kernels' libraries do: MIOpen, Tensile, hipBLASLt, CK → AMD; cuDNN, cuBLAS, CUTLASS →
NVIDIA). `Spec.matched` says which, for the finding's basis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .trace import Device

MATRIX_DTYPES = ("tf32", "bf16", "fp16", "fp8")
# Host↔device bandwidth of pinned copies over the GPU's PCIe link, GB/s: what PCIe 5.0 / 4.0 / 3.0 x16
# deliver in practice (64 / 32 / 16 GB/s on paper; ~50 / ~25 / ~12 measured for large pinned copies: 55
# GB/s on the H100 pairs). Pageable copies are staged through a pinned bounce buffer and reach a fraction.
PINNED_GBPS = {5: 50.0, 4: 25.0, 3: 12.0}


@dataclass(frozen=True)
class Spec:
    product: str  # "H100 SXM", or the architecture's representative for a fallback row
    vendor: str  # "nvidia", "amd", "unknown"
    arch: str  # "Hopper", "CDNA 3", ...
    fp32: float | None  # dense fp32 SIMT (CUDA cores / vector ALUs), TFLOP/s
    tf32: float | None  # dense matrix-unit peaks, TFLOP/s; None where the product has no such path
    bf16: float | None
    fp16: float | None
    fp8: float | None
    memory_gbps: float | None  # device memory bandwidth, GB/s
    pcie_gen: int | None  # the host link's PCIe generation
    matched: str = "name"  # how the device was matched: "name", "architecture", "kernel names", "fallback"
    # AMD CDNA 1/2 run fp32 GEMMs on their matrix cores at twice the vector rate (MFMA fp32); elsewhere fp32
    # matrix and vector peaks are the same, or (NVIDIA) fp32 has no matrix path
    fp32_matrix: float | None = None

    @property
    def matrix_dtypes(self) -> tuple[str, ...]:
        """The dtypes with a Tensor Core / matrix-core path on this device."""
        return tuple(d for d in MATRIX_DTYPES if getattr(self, d) is not None)

    @property
    def has_matrix_units(self) -> bool | None:
        return None if self.matched == "fallback" else bool(self.matrix_dtypes)

    def peak(self, dtype: str) -> float | None:
        """Dense peak TFLOP/s of `dtype` ("fp32" for SIMT, or a matrix dtype)."""
        return getattr(self, dtype, None)

    def speedup(self, dtype: str) -> float | None:
        """How much faster a large fp32 GEMM runs in `dtype` on the matrix units: the ratio of the dense peaks
        (large GEMMs reach a similar fraction of either; the H100 pairs: 77 % of fp32 SIMT, 78 % bf16, 81 %
        TF32), one decimal."""
        p = self.peak(dtype)
        return round(p / self.fp32, 1) if p and self.fp32 else None

    def dense_peak(self, dtype: str) -> tuple[float | None, str]:
        """The dense peak a matrix op in `dtype` can reach, TFLOP/s, and the dtype whose peak it is: fp32 at
        its matrix rate where that is faster (AMD MFMA); a dtype the device has no units for (bf16 on a V100,
        fp64) stands in with the fp32 peak, the rate it then runs at. (None, dtype) without a known peak."""
        if dtype == "fp32":
            best = max(self.fp32 or 0.0, self.fp32_matrix or 0.0)
            return (best or None), "fp32"
        peak = self.peak(dtype) if dtype in MATRIX_DTYPES else None
        return (peak, dtype) if peak else (self.dense_peak("fp32")[0], "fp32")

    @property
    def half_peak(self) -> float | None:
        """Dense bf16 (else fp16) matrix peak: what an aligned half-precision GEMM can reach when no aligned
        GEMM in the trace shows what this device really does."""
        return self.bf16 or self.fp16

    @property
    def pinned_copy_gbps(self) -> float:
        """The pinned host↔device bandwidth to expect on this GPU's PCIe generation (12 GB/s if unknown)."""
        return PINNED_GBPS.get(self.pcie_gen or 3, PINNED_GBPS[3])

    def describe(self) -> str:
        how = {"name": "", "architecture": " (by its architecture)", "kernel names": " (by its kernel names)"}
        return f"{self.product}{how.get(self.matched, '')}"


def _nv(product, arch, fp32, tf32, bf16, fp16, fp8, memory, pcie) -> Spec:
    return Spec(product, "nvidia", arch, fp32, tf32, bf16, fp16, fp8, memory, pcie)


def _amd(product, arch, fp32, tf32, bf16, fp16, fp8, memory, pcie, fp32_matrix=None) -> Spec:
    return Spec(product, "amd", arch, fp32, tf32, bf16, fp16, fp8, memory, pcie, fp32_matrix=fp32_matrix)


# (name pattern, spec): the first match wins, so specific names come before the families they belong to.
PRODUCTS: list[tuple[re.Pattern, Spec]] = [(re.compile(p, re.I), s) for p, s in [
    # Volta
    (r"v100.*pcie", _nv("V100 PCIe", "Volta", 14.0, None, None, 112.0, None, 900, 3)),
    (r"v100s", _nv("V100S PCIe", "Volta", 16.4, None, None, 130.0, None, 1134, 3)),
    (r"v100", _nv("V100 SXM2", "Volta", 15.7, None, None, 125.0, None, 900, 3)),
    (r"titan v\b", _nv("TITAN V", "Volta", 14.9, None, None, 110.0, None, 653, 3)),
    # Turing
    (r"\bt4\b", _nv("T4", "Turing", 8.1, None, None, 65.0, None, 320, 3)),
    (r"rtx 2080 ti", _nv("GeForce RTX 2080 Ti", "Turing", 13.4, None, None, 53.8, None, 616, 3)),
    (r"quadro rtx [68]000", _nv("Quadro RTX 6000/8000", "Turing", 16.3, None, None, 130.5, None, 672, 3)),
    # Ampere
    (r"a100.*(pcie|pci-e)", _nv("A100 PCIe", "Ampere", 19.5, 156.0, 312.0, 312.0, None, 1935, 4)),
    (r"a100", _nv("A100 SXM", "Ampere", 19.5, 156.0, 312.0, 312.0, None, 2039, 4)),
    (r"\ba30\b", _nv("A30", "Ampere", 10.3, 82.0, 165.0, 165.0, None, 933, 4)),
    (r"\ba10g\b", _nv("A10G", "Ampere", 31.2, 35.0, 70.0, 70.0, None, 600, 4)),
    (r"\ba10\b", _nv("A10", "Ampere", 31.2, 62.5, 125.0, 125.0, None, 600, 4)),
    (r"\ba40\b", _nv("A40", "Ampere", 37.4, 74.8, 149.7, 149.7, None, 696, 4)),
    (r"rtx 3090", _nv("GeForce RTX 3090", "Ampere", 35.6, 35.6, 71.0, 71.0, None, 936, 4)),
    # Ada
    (r"\bl4\b", _nv("L4", "Ada", 30.3, 60.0, 121.0, 121.0, 242.5, 300, 4)),
    (r"\bl40s\b", _nv("L40S", "Ada", 91.6, 183.0, 362.0, 362.0, 733.0, 864, 4)),
    (r"\bl40\b", _nv("L40", "Ada", 90.5, 90.5, 181.0, 181.0, 362.0, 864, 4)),
    (r"rtx 6000 ada", _nv("RTX 6000 Ada", "Ada", 91.1, 182.1, 364.2, 364.2, 728.5, 960, 4)),
    (r"rtx 4090", _nv("GeForce RTX 4090", "Ada", 82.6, 82.6, 165.2, 165.2, 330.3, 1008, 4)),
    # Hopper
    (r"h100.*nvl", _nv("H100 NVL", "Hopper", 60.0, 417.5, 835.0, 835.0, 1670.0, 3900, 5)),
    (r"h[18]00.*(pcie|pci-e)", _nv("H100 PCIe", "Hopper", 51.2, 378.0, 756.0, 756.0, 1513.0, 2000, 5)),
    (r"gh200", _nv("GH200", "Hopper", 66.9, 494.7, 989.4, 989.4, 1978.9, 4000, 5)),
    (r"h200", _nv("H200", "Hopper", 66.9, 494.7, 989.4, 989.4, 1978.9, 4800, 5)),
    (r"h[18]00", _nv("H100 SXM", "Hopper", 66.9, 494.7, 989.4, 989.4, 1978.9, 3350, 5)),
    # Blackwell
    (r"gb200", _nv("GB200", "Blackwell", 80.0, 1250.0, 2500.0, 2500.0, 5000.0, 8000, 5)),
    (r"b200", _nv("B200", "Blackwell", 75.0, 1100.0, 2250.0, 2250.0, 4500.0, 8000, 5)),
    (r"b100", _nv("B100", "Blackwell", 60.0, 875.0, 1750.0, 1750.0, 3500.0, 8000, 5)),
    (r"rtx 5090", _nv("GeForce RTX 5090", "Blackwell", 104.8, 209.5, 419.0, 419.0, 838.0, 1792, 5)),
    # Pascal and older: no Tensor Cores
    (r"p100|gp100", _nv("P100", "Pascal", 9.3, None, None, None, None, 732, 3)),
    (r"\bp40\b|\bp4\b|gtx 10\d0|titan x", _nv("Pascal (P40/P4/GTX 10)", "Pascal", 11.8, None, None, None, None, 346, 3)),
    (r"k80|m40|m60|maxwell|kepler", _nv("Kepler/Maxwell", "Maxwell", 7.0, None, None, None, None, 288, 3)),
    # AMD
    (r"mi325", _amd("MI325X", "CDNA 3", 163.4, 653.7, 1307.4, 1307.4, 2614.9, 6000, 5)),
    (r"mi300a", _amd("MI300A", "CDNA 3", 122.6, 490.3, 980.6, 980.6, 1961.2, 5300, 5)),
    (r"mi300", _amd("MI300X", "CDNA 3", 163.4, 653.7, 1307.4, 1307.4, 2614.9, 5300, 5)),
    (r"mi250x", _amd("MI250X (one GCD)", "CDNA 2", 23.9, None, 191.5, 191.5, None, 1638, 4, 47.9)),
    (r"mi250", _amd("MI250 (one GCD)", "CDNA 2", 22.6, None, 181.0, 181.0, None, 1638, 4, 45.3)),
    (r"mi210", _amd("MI210", "CDNA 2", 22.6, None, 181.0, 181.0, None, 1638, 4, 45.3)),
    (r"mi100", _amd("MI100", "CDNA", 23.1, None, 92.3, 184.6, None, 1228, 4, 46.1)),
]]


def _product(name: str) -> Spec:
    return next(s for _, s in PRODUCTS if s.product == name)


# Architecture rows: what a device not named above gets from its compute capability (NVIDIA) or its gfx
# version on ROCm (AMD), each the family's common datacenter part.
NVIDIA_ARCH = [((12, 0), "GeForce RTX 5090"), ((10, 0), "B200"), ((9, 0), "H100 SXM"), ((8, 9), "L40S"),
               ((8, 6), "A10"), ((8, 0), "A100 SXM"), ((7, 5), "T4"), ((7, 0), "V100 SXM2"), ((6, 0), "P100"),
               ((0, 0), "Kepler/Maxwell")]
# gfx94x, gfx90a; RDNA (gfx10 and later) is not in the table
AMD_ARCH = [((10, 0), None), ((9, 4), "MI300X"), ((9, 0), "MI250 (one GCD)"), ((0, 0), "MI100")]

# Kernel names that show the architecture they were built for (cuBLAS/cuDNN/CUTLASS family prefixes),
# newest first: a kernel built for an architecture runs on it or a newer one, so the newest a trace shows
# is the GPU's.
ARCH_FROM_NAME = [
    (re.compile(r"sm100|blackwell|fmhaSm100", re.I), (10, 0)),
    (re.compile(r"sm90|hopper|nvjet", re.I), (9, 0)),
    (re.compile(r"ampere|sm80|sm86", re.I), (8, 0)),
    (re.compile(r"turing|sm75", re.I), (7, 5)),
    (re.compile(r"volta|sm70", re.I), (7, 0)),
    (re.compile(r"maxwell|pascal|sm6\d", re.I), (6, 0)),
]
NVIDIA_ARCH_NAMES = {(10, 0): "Blackwell", (9, 0): "Hopper", (8, 0): "Ampere", (7, 5): "Turing", (7, 0): "Volta",
                     (6, 0): "Pascal"}
# AMD: Tensile/hipBLASLt kernels name the ISA they were built for (`…_ISA942_…`), other kernels the gfx
# target (`…_gfx90a_…`); newest first.
AMD_ISA_FROM_NAME = [
    (re.compile(r"(?:ISA|gfx)(94[0-2])(?![0-9a-z])", re.I), "CDNA 3", "MI300X"),
    (re.compile(r"(?:ISA|gfx)(90a)(?![0-9a-z])", re.I), "CDNA 2", "MI250 (one GCD)"),
    (re.compile(r"(?:ISA|gfx)(908)(?![0-9a-z])", re.I), "CDNA", "MI100"),
]
# Libraries only one vendor ships: AMD's MIOpen, Tensile (`Cijk_…`), hipBLASLt, Composable Kernel, RCCL's
# own kernels, the HIP runtime's blit kernels; NVIDIA's cuDNN, cuBLAS, CUTLASS, nvjet. (NCCL's kernel
# names say nothing: RCCL keeps them.)
VENDOR_FROM_NAME = [
    (re.compile(r"miopen|Cijk_|hipblaslt|rccl|\bck::|ck_tile|__amd_rocclr|igemm_\w*gtc|naive_conv_", re.I), "amd"),
    (re.compile(r"cudnn|cublas|cutlass|nvjet|xmma", re.I), "nvidia"),
]
VENDOR_WORDS = {"amd": "AMD", "nvidia": "NVIDIA"}

FALLBACK = Spec("an unknown GPU", "unknown", "unknown", None, None, None, None, None, None, None, matched="fallback")


@dataclass(frozen=True)
class FromKernels:
    """What a trace's kernel names say about the GPU that ran them, when the trace does not name it."""

    vendor: str  # "amd" or "nvidia"
    token: str  # the part of a name that says so ("ISA942", "sm90", "MIOpen")
    arch: str | None = None  # "CDNA 3", "Hopper", … (None: the vendor only)
    row: Spec | None = None  # the device table's row for that architecture (matched "kernel names")

    def describe(self) -> str:
        """The GPU in words, saying how it was named: "an AMD CDNA 3 GPU, named from its kernels (ISA942)"."""
        what = f"{VENDOR_WORDS[self.vendor]} {self.arch}" if self.arch else VENDOR_WORDS[self.vendor]
        return f"an {what} GPU, named from its kernels ({self.token})"


def from_kernels(kernel_names) -> FromKernels | None:
    """The vendor and architecture the kernel names show (the newest architecture any of them was built
    for), None when no name says."""
    names = [str(n) for n in kernel_names]
    for pattern, arch, product in AMD_ISA_FROM_NAME:
        hit = next((m for m in map(pattern.search, names) if m), None)
        if hit:
            return FromKernels("amd", hit.group(0), arch, replace(_product(product), matched="kernel names"))
    for pattern, cc in ARCH_FROM_NAME:
        hit = next((m for m in map(pattern.search, names) if m), None)
        if hit:
            return FromKernels("nvidia", hit.group(0), NVIDIA_ARCH_NAMES[cc], _arch_row(NVIDIA_ARCH, cc, "kernel names"))
    for pattern, vendor in VENDOR_FROM_NAME:
        hit = next((m for m in map(pattern.search, names) if m), None)
        if hit:
            return FromKernels(vendor, hit.group(0))
    return None


def _arch_row(table, cc: tuple[int, int], matched: str) -> Spec:
    """The table's row for compute capability `cc`: the newest architecture at or below it; FALLBACK for one
    the table does not hold (below every row: a damaged header's 0.-1)."""
    product = next((p for floor, p in table if cc >= floor), None)
    return replace(_product(product), matched=matched) if product else FALLBACK


def spec(device: Device | None, platform: str = "unknown", kernel_names=()) -> Spec:
    """The device's row: by name, else architecture, else kernel names; FALLBACK when none says (with the
    vendor where the platform or the kernels tell it)."""
    name = (device.name if device is not None else "") or ""
    amd = (device is not None and device.vendor == "amd") or platform == "rocm"
    for pattern, row in PRODUCTS:
        if name and pattern.search(name) and (row.vendor == "amd") == amd:
            if row.product.startswith("A100") and (device.total_memory or 1 << 62) < 50 * 2**30:
                return replace(row, memory_gbps=1555)  # the 40 GB A100 has the slower HBM2
            return row
    if device is not None and device.compute_major is not None:
        cc = (device.compute_major, device.compute_minor or 0)
        return _arch_row(AMD_ARCH if amd else NVIDIA_ARCH, cc, "architecture")
    seen = from_kernels(kernel_names)
    if seen is not None and (seen.vendor == "amd" or not amd):  # never an NVIDIA row on ROCm
        return seen.row if seen.row is not None else replace(FALLBACK, vendor=seen.vendor)
    return replace(FALLBACK, vendor="amd") if amd else FALLBACK
