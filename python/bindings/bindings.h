// Shared declarations of the pagedllm._core binding units.
#pragma once

#include <pybind11/pybind11.h>

namespace pagedllm::python {

// Each registers one family of classes / functions on the module.
void bind_build_info(pybind11::module_& m);
void bind_core(pybind11::module_& m);
void bind_store(pybind11::module_& m);      // bind_store.cpp: BlockStore, block_key
void bind_kernels(pybind11::module_& m);  // bind_kernels.cpp, when the CPU kernels are built
void bind_sparse_kernels(pybind11::module_& m);  // bind_sparse.cpp, with bind_kernels
void bind_cross_kernels(pybind11::module_& m);   // bind_cross.cpp, with bind_kernels
void bind_fused_kernels(pybind11::module_& m);   // bind_fused.cpp, from bind_kernels
void bind_linear_kernels(pybind11::module_& m);  // bind_linear.cpp, from bind_kernels
void bind_decoder_kernels(pybind11::module_& m);  // bind_decoder.cpp, from bind_kernels
void bind_cuda(pybind11::module_& m);     // bind_cuda.cpp: submodule `cuda`, when CUDA is built

}  // namespace pagedllm::python
