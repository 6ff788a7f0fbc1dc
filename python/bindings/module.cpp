// PYBIND11_MODULE(_core): wires the binding units together and maps pagedllm::Error to
// Python exceptions (kInvalidArgument -> ValueError, kOutOfRange -> IndexError,
// kInvalidState -> RuntimeError, kIo -> OSError).
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "pagedllm/error.h"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "pagedllm C++ core: KV-cache block management and paged-attention kernels";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const pagedllm::Error& e) {
      switch (e.kind()) {
        case pagedllm::ErrorKind::kInvalidArgument:
          PyErr_SetString(PyExc_ValueError, e.what());
          return;
        case pagedllm::ErrorKind::kOutOfRange:
          PyErr_SetString(PyExc_IndexError, e.what());
          return;
        case pagedllm::ErrorKind::kInvalidState:
          PyErr_SetString(PyExc_RuntimeError, e.what());
          return;
        case pagedllm::ErrorKind::kIo:
          PyErr_SetString(PyExc_OSError, e.what());
          return;
      }
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  m.attr("__version__") = PAGEDLLM_VERSION;
  pagedllm::python::bind_build_info(m);
  pagedllm::python::bind_core(m);
  pagedllm::python::bind_store(m);
#ifdef PAGEDLLM_WITH_KERNELS
  pagedllm::python::bind_kernels(m);
  pagedllm::python::bind_sparse_kernels(m);
  pagedllm::python::bind_cross_kernels(m);
#endif
#ifdef PAGEDLLM_WITH_CUDA
  pagedllm::python::bind_cuda(m);
#endif
}
