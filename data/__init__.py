"""PTB data: download, vocabulary, batches, shards. Imports neither TensorFlow nor Horovod."""
