# The one list of C++/CUDA sources, read by CMakeLists.txt and by setup.py (which parses these set() calls:
# keep one path per line, relative to the repository root).

# Torch-free core: the tree- and graph-distance builders, the relation/window list builder and the tree decoder (used by the extension and
# by the C++ tests).
set(SYNTAXKERNELS_CORE_SOURCES
    csrc/tree_distance.cpp
    csrc/graph_distance.cpp
    csrc/relation_lists.cpp
    csrc/mst_decode.cpp
)

# Python bindings of syntaxkernels._C, the CPU edge-list attention, the CPU distance-bias attention and the launcher
# replay's key and buffers (need torch).
set(SYNTAXKERNELS_BINDING_SOURCES
    csrc/bindings.cpp
    csrc/edge_attention.cpp
    csrc/bias_attention.cpp
    csrc/replay.cpp
)

# CUDA builder: kernels (plain CUDA C++) and their torch launcher; only in a CUDA build.
set(SYNTAXKERNELS_CUDA_SOURCES
    csrc/cuda/tree_distance_cuda.cu
    csrc/cuda/launcher.cpp
)

# C++ tests of the core, run by ctest.
set(SYNTAXKERNELS_TEST_SOURCES
    csrc/tests/test_tree_distance.cpp
    csrc/tests/test_relation_lists.cpp
    csrc/tests/test_packed_builder.cpp
)
