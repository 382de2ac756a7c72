"""Small model of Zaremba et al. 2014 (non-regularized LSTM, PTB test perplexity ~115).

`batch_size` is the GLOBAL batch: with N Horovod workers each one trains on
batch_size / N rows, so the update per step is the single-process update and
the learning rate is NOT scaled with the number of workers.
"""

init_scale = 0.1
learning_rate = 1.0
max_grad_norm = 5
num_layers = 2
num_steps = 20
hidden_size = 200
max_epoch = 4
num_epochs = 13
keep_prob = 1.0
lr_decay = 0.5
batch_size = 20

# Smoke runs and benchmarks: None = the full epoch / the whole valid and test sets.
steps_per_epoch = None
eval_steps = None
# The final test is read as eval_batch_size streams cut into eval_num_steps windows, the LSTM
# state carried across windows: batch 1 scores every token with its whole left context. The
# per-epoch validation takes the training layout (valid_batch_size / valid_num_steps to change).
eval_batch_size = 1
eval_num_steps = 35
# Gradient accumulation: each worker's rows run as this many slices, one backward pass each,
# and the summed gradient makes one update: the same step with less activation memory.
backward_passes_per_step = 1
# The matmuls' precision: "fp32" as in the paper, or "bf16" (bfloat16 operands, all else fp32)
# for CPUs and GPUs with bf16 units (docs/precision.md).
precision = "fp32"
