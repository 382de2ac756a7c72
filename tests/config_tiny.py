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

# Horovod options (lm_ptb_distributed.py; one process ignores them). See README "Communication".
scale_lr = False  # multiply learning_rate by the number of workers (batch_size is global: off)
fp16_allreduce = False  # send dense gradients as float16
sparse_as_dense = False  # allreduce the embedding gradient as a dense tensor, not allgather it
reduce_type = "grad"  # "grad": allreduce gradients each step; "param": average weights
param_sync_steps = 10  # with reduce_type "param": average the weights every this many steps
timeline = False  # write a Horovod timeline to <output_dir>/timeline.json (rank 0)
