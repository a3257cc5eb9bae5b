"""transformers' Trainer with gpuadvise's callback, launched as `python hf_callback.py RUN OUT`: a checkpoint
is saved after optimizer step 4, num_workers=0."""

import sys

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from gpuadvise.integrations.huggingface import GpuadviseCallback
from slow_data import SlowTokens

run, out = sys.argv[1], sys.argv[2]
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=64))
args = TrainingArguments(output_dir=out, max_steps=7, per_device_train_batch_size=8, dataloader_num_workers=0,
                         save_strategy="steps", save_steps=4, logging_strategy="no", report_to="none", use_cpu=True,
                         disable_tqdm=True)
profiler = GpuadviseCallback(run, wait=2, warmup=1, active=3, log_findings=True)
trainer = Trainer(model=model, args=args, train_dataset=SlowTokens(), callbacks=[profiler])
trainer.train()
