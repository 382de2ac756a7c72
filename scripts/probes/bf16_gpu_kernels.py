"""Which dtypes TensorFlow 2.21's GPU build registers for the cuDNN LSTM and matmul kernels.

Run with the GPU wheel (pip install tensorflow==2.21.0, no GPU needed: kernels are registered
when the library loads) in a venv of its own:
    python scripts/probes/bf16_gpu_kernels.py
"""
import sys

try:
    import tensorflow as tf
    from tensorflow.python.framework import kernels
except ModuleNotFoundError as e:
    if e.name != "tensorflow":  # a TensorFlow there but broken: its own error says what
        raise
    sys.exit(f"error: {sys.executable} has no TensorFlow; run this probe with the GPU wheel "
             "in a venv of its own: python -m venv gpu && gpu/bin/pip install "
             "tensorflow==2.21.0 && gpu/bin/python scripts/probes/bf16_gpu_kernels.py")


def main():
    info = tf.sysconfig.get_build_info()
    print(f"tensorflow {tf.__version__}, CUDA {info.get('cuda_version')}, "
          f"cuDNN {info.get('cudnn_version')}")
    for op in ("CudnnRNNV3", "CudnnRNNBackpropV3", "MatMul"):
        types = sorted(tf.dtypes.as_dtype(t).name
                       for k in kernels.get_registered_kernels_for_op(op).kernel
                       if k.device_type == "GPU"
                       for c in k.constraint if c.name == "T" for t in c.allowed_values.list.type)
        print(f"{op}: GPU kernels for {', '.join(types)}")


if __name__ == "__main__":
    main()
