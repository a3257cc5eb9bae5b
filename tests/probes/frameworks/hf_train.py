"""transformers' Trainer, launched as `gpuadvise profile hf_train.py`: a tiny GPT-2 built from a config,
gradient accumulation over 2 micro-batches, an evaluation after optimizer step 4, num_workers=0."""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from slow_data import SlowTokens

out = sys.argv[1]
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=64))
args = TrainingArguments(output_dir=out, max_steps=7, per_device_train_batch_size=8, gradient_accumulation_steps=2,
                         eval_strategy="steps", eval_steps=4, per_device_eval_batch_size=8, dataloader_num_workers=0,
                         save_strategy="no", logging_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=SlowTokens(), eval_dataset=torch.utils.data.Subset(SlowTokens(), range(16)))
trainer.train()
