// dlpack_tensor.h — borrowing torch tensors / numpy arrays zero-copy through DLPack.
//
// The structs below are this project's own declarations of the DLPack C ABI (v1.x, from the
// public specification at dmlc/dlpack): only the fields the kernels read. A Tensor first tries
// the producer's C exchange table (`type(obj).__dlpack_c_exchange_api__`, torch >= 2.9): it
// fills a DLTensor that borrows from the object in well under a microsecond, and the Tensor
// keeps a reference to the object. Otherwise it asks for a capsule
// (`__dlpack__(max_version=(1, 0))`, falling back to the legacy unversioned `__dlpack__()`),
// marks it used, and calls the producer's deleter when destroyed. It never links torch.
// Callers must not resize or re-point a tensor while a kernel borrows it.
// Thread-safety: create and destroy with the GIL held (deleters may touch Python objects); the
// accessors are plain reads, safe without the GIL while the Tensor lives.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

namespace pagedllm::python {

namespace dlpack {

struct DLDevice {
  int32_t device_type;  // 1 = CPU, 2 = CUDA, 3 = CUDA host (pinned), ...
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 10 float8_e4m3fn, 12 float8_e5m2
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means compact row-major
  uint64_t byte_offset;
};

struct DLManagedTensor {  // legacy capsule "dltensor"
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

struct DLManagedTensorVersioned {  // capsule "dltensor_versioned" (DLPack >= 1.0)
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;  // bit 0: read-only
  DLTensor dl_tensor;
};

// The C exchange table a producer may publish on its type (capsule "dlpack_exchange_api").
struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  DLPackExchangeAPIHeader* prev_api;
};

struct DLPackExchangeAPI {
  DLPackExchangeAPIHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  // Fills `out` with a view borrowing from the object; 0 on success, -1 with a Python error set.
  int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out);
  void* current_work_stream;
};

constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;
constexpr int32_t kDLCUDAHost = 3;
constexpr uint64_t kFlagReadOnly = 1;

}  // namespace dlpack

// Element types the kernels distinguish.
enum class DType { kFloat32, kFloat16, kBFloat16, kUInt8, kInt32, kInt64, kFloat8E4M3FN,
                   kFloat8E5M2, kOther };

// A tensor borrowed for one call. Move-only.
class Tensor {
 public:
  // Borrows `obj` (anything with __dlpack__); `name` is used in error messages.
  Tensor(pybind11::handle obj, const char* name);
  ~Tensor();
  Tensor(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor& operator=(Tensor&&) = delete;

  const char* name() const { return name_; }
  // First element (byte_offset applied).
  void* data() const;
  DType dtype() const { return dtype_; }
  int itemsize() const { return tensor_->dtype.bits / 8; }
  int ndim() const { return tensor_->ndim; }
  int64_t size(int dim) const { return tensor_->shape[dim]; }
  // Stride of `dim` in elements (compact row-major when the producer gave none).
  int64_t stride(int dim) const;
  int64_t numel() const;
  bool read_only() const { return read_only_; }
  // E.g. "float32[4, 8, 128] on cpu".
  std::string describe() const;

  // Throws ValueError unless the tensor lives in host memory the CPU can read.
  void require_cpu() const;
  // Throws ValueError unless the tensor has `ndim` dims.
  void require_ndim(int ndim) const;
  // Throws ValueError unless the producer allows writing.
  void require_writable() const;
  // Throws ValueError unless dims [from, ndim) are contiguous (row-major, size-1 dims ignored).
  void require_inner_contiguous(int from) const;

 private:
  // Fast path: the producer's exchange table filled borrowed_; owner_ keeps the object alive.
  bool borrow_from_exchange_api(pybind11::handle obj);

  const char* name_;
  pybind11::object owner_;
  dlpack::DLTensor borrowed_{};
  dlpack::DLTensor* tensor_ = nullptr;
  dlpack::DLManagedTensor* legacy_ = nullptr;
  dlpack::DLManagedTensorVersioned* versioned_ = nullptr;
  DType dtype_ = DType::kOther;
  bool read_only_ = false;
};

// Name of a DType ("float32", ...).
const char* dtype_name(DType t);

}  // namespace pagedllm::python
