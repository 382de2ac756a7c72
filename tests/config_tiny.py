"""A model small enough to train end to end in seconds in the tests (same keys as config_small)."""

init_scale = 0.1
learning_rate = 1.0
max_grad_norm = 5
num_layers = 2
num_steps = 10
hidden_size = 32
max_epoch = 2
num_epochs = 3
keep_prob = 1.0
lr_decay = 0.5
batch_size = 20

steps_per_epoch = None
eval_steps = None
eval_batch_size = 1
eval_num_steps = 20
# Gradient accumulation: each worker's rows run as this many slices, one backward pass each,
# and the summed gradient makes one update: the same step with less activation memory.
backward_passes_per_step = 1
