"""External dependencies of verify_attn: pinned wheels only, no URLs."""

load("//tools/bazel:pypi_wheels.bzl", "pypi_wheels")

# CUDA 13.0 Update 2, one release: the versions NVIDIA ships together.
# 13.0.x so the PTX and cubins load on driver 580 (CUDA 13.0), see DESIGN.md §6.
CUDA_WHEELS = {
    "nvidia-cuda-nvcc==13.0.88": "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03",
    "nvidia-cuda-crt==13.0.88": "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4",
    "nvidia-nvvm==13.0.88": "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0",
    "nvidia-cuda-runtime==13.0.96": "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
    "nvidia-cuda-cccl==13.0.85": "e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649",
}

# cuobjdump and nvdisasm are not published for 13.0 on PyPI; 13.2 reads 13.0
# binaries and is only used to inspect what we built (never to build):
# //tools/checks:cubin_archs_test, //tools/dev:sass.
CUOBJDUMP_WHEELS = {
    "nvidia-cuda-cuobjdump==13.2.86": "d332c2ffe78e703ca0a3894be927f83124244e2acf0d792b8c12b4362d44d837",
    "nvidia-cuda-nvdisasm==13.2.86": "53606e719ecae07a2335f95902d5a1393a0cc1c317499ee7ffcf628a44385f2c",
}

PYBIND11_WHEELS = {
    "pybind11==3.0.1": "aa8f0aa6e0a94d3b64adfc38f560f33f15e589be2175e103c0a33c6bce55ee89",
}

def verify_attn_dependencies():
    pypi_wheels(
        name = "cuda",
        packages = CUDA_WHEELS,
        build_file = "//tools/bazel/cuda:cuda.BUILD",
    )
    pypi_wheels(
        name = "cuda_tools",
        packages = CUOBJDUMP_WHEELS,
        build_file = "//tools/bazel/cuda:cuda_tools.BUILD",
    )
    pypi_wheels(
        name = "pybind11",
        packages = PYBIND11_WHEELS,
        build_file = "//tools/bazel/python:pybind11.BUILD",
    )
