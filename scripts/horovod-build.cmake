# CMake settings for setup.sh's Horovod build, given as CMAKE_TOOLCHAIN_FILE (read by CMake
# 3.21 and later; older ones ignore it and build as before).
# Horovod's setup.py always configures RelWithDebInfo, which GCC compiles with -g; its
# CMakeLists turns -O2 into -O3. The debug information for TensorFlow's and Eigen's headers
# took about 30% of the build's CPU time and 55.7 of mpi_lib's 57.9 MB (docs/testing.md#ci).
# The same code without it (-g does not change what GCC generates): -O2 here, -O3 after
# Horovod's replace.
set(CMAKE_C_FLAGS_RELWITHDEBINFO "-O2 -DNDEBUG" CACHE STRING "")
set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O2 -DNDEBUG" CACHE STRING "")
set(CMAKE_CUDA_FLAGS_RELWITHDEBINFO "-O2 -DNDEBUG" CACHE STRING "")
