// _core.build_info(): what was compiled in (CUDA, CPU kernel variants) and what the machine has
// at run time (CPU features, GPUs).
#include <pybind11/stl.h>

#include "bindings.h"
#include "pagedllm/build_info.h"
#ifdef PAGEDLLM_WITH_CUDA
#include "pagedllm/cuda/runtime.h"
#endif

namespace py = pybind11;

namespace pagedllm::python {

void bind_build_info(py::module_& m) {
  m.def(
      "build_info",
      [] {
        py::dict d;
        d["version"] = version();
#ifdef PAGEDLLM_WITH_CUDA
        d["cuda_compiled"] = true;
        d["cuda_runtime_version"] = cuda::runtime_version();
        const int n = cuda::device_count();
        py::list names;
        for (int i = 0; i < n; ++i) names.append(cuda::device_name(i));
        d["cuda_driver_version"] = cuda::driver_version();
        d["gpu_count"] = n;
        d["gpu_names"] = names;
#else
        d["cuda_compiled"] = false;
        d["cuda_runtime_version"] = "";
        d["cuda_driver_version"] = "";
        d["gpu_count"] = 0;
        d["gpu_names"] = py::list();
#endif
        d["cpu_kernels_compiled"] = compiled_cpu_kernels();
        const CpuFeatures& f = cpu_features();
        py::list cpu;
        if (f.avx2) cpu.append("avx2");
        if (f.fma) cpu.append("fma");
        if (f.f16c) cpu.append("f16c");
        if (f.avx512f) cpu.append("avx512f");
        if (f.avx512bw) cpu.append("avx512bw");
        if (f.avx512vl) cpu.append("avx512vl");
        if (f.avx512dq) cpu.append("avx512dq");
        if (f.avx512bf16) cpu.append("avx512bf16");
        if (f.amx_bf16) cpu.append("amx_bf16");
        if (f.avx512vbmi) cpu.append("avx512vbmi");
        d["cpu_features"] = cpu;
        d["block_store_backends"] = compiled_block_store_backends();
        d["compiler"] = __VERSION__;
        return d;
      },
      "Build and run-time facts: version, cuda_compiled, cuda_runtime_version, "
      "cuda_driver_version, gpu_count, gpu_names, cpu_kernels_compiled, cpu_features, block_store_backends, compiler.");
}

}  // namespace pagedllm::python
