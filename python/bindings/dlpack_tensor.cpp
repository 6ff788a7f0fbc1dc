#include "dlpack_tensor.h"

#include "pagedllm/error.h"

namespace py = pybind11;

namespace pagedllm::python {
namespace {

DType classify(const dlpack::DLDataType& t) {
  if (t.lanes != 1) return DType::kOther;
  switch (t.code) {
    case 0:
      return t.bits == 32 ? DType::kInt32 : t.bits == 64 ? DType::kInt64 : DType::kOther;
    case 1:
      return t.bits == 8 ? DType::kUInt8 : DType::kOther;
    case 2:
      return t.bits == 32 ? DType::kFloat32 : t.bits == 16 ? DType::kFloat16 : DType::kOther;
    case 4:
      return t.bits == 16 ? DType::kBFloat16 : DType::kOther;
    case 10:
      return t.bits == 8 ? DType::kFloat8E4M3FN : DType::kOther;
    case 12:
      return t.bits == 8 ? DType::kFloat8E5M2 : DType::kOther;
    default:
      return DType::kOther;
  }
}

const char* device_name(int32_t type) {
  switch (type) {
    case dlpack::kDLCPU: return "cpu";
    case dlpack::kDLCUDA: return "cuda";
    case dlpack::kDLCUDAHost: return "cuda_host";
    default: return "an unsupported device";
  }
}

}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kUInt8: return "uint8";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat8E4M3FN: return "float8_e4m3fn";
    case DType::kFloat8E5M2: return "float8_e5m2";
    case DType::kOther: return "an unsupported dtype";
  }
  return "?";
}

bool Tensor::borrow_from_exchange_api(py::handle obj) {
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()));
  PyObject* cap = PyObject_GetAttrString(type, "__dlpack_c_exchange_api__");
  if (!cap) {
    PyErr_Clear();
    return false;
  }
  const py::object holder = py::reinterpret_steal<py::object>(cap);
  if (!PyCapsule_IsValid(cap, "dlpack_exchange_api")) return false;
  const auto* api =
      static_cast<const dlpack::DLPackExchangeAPI*>(PyCapsule_GetPointer(cap, "dlpack_exchange_api"));
  if (!api || api->header.version.major != 1 || !api->dltensor_from_py_object_no_sync) return false;
  if (api->dltensor_from_py_object_no_sync(obj.ptr(), &borrowed_) != 0) throw py::error_already_set();
  owner_ = py::reinterpret_borrow<py::object>(obj);
  tensor_ = &borrowed_;
  return true;
}

Tensor::Tensor(py::handle obj, const char* name) : name_(name) {
  if (borrow_from_exchange_api(obj)) {
    dtype_ = classify(tensor_->dtype);
    return;
  }
  PAGEDLLM_CHECK_ARG(py::hasattr(obj, "__dlpack__"),
                     name << " must be a torch.Tensor or numpy.ndarray (an object with "
                             "__dlpack__), got "
                          << std::string(py::str(py::type::of(obj).attr("__name__"))));
  py::object capsule;
  try {
    capsule = obj.attr("__dlpack__")(py::arg("max_version") = py::make_tuple(1, 0));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    capsule = obj.attr("__dlpack__")();  // a producer that predates versioned DLPack
  }
  PyObject* cap = capsule.ptr();
  if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
    versioned_ = static_cast<dlpack::DLManagedTensorVersioned*>(
        PyCapsule_GetPointer(cap, "dltensor_versioned"));
    PyCapsule_SetName(cap, "used_dltensor_versioned");
    if (versioned_->version.major != 1) {
      const uint32_t major = versioned_->version.major;
      if (versioned_->deleter) versioned_->deleter(versioned_);
      versioned_ = nullptr;
      PAGEDLLM_CHECK_ARG(false, name << ": DLPack major version " << major
                                     << " is not supported (expected 1)");
    }
    tensor_ = &versioned_->dl_tensor;
    read_only_ = (versioned_->flags & dlpack::kFlagReadOnly) != 0;
  } else if (PyCapsule_IsValid(cap, "dltensor")) {
    legacy_ = static_cast<dlpack::DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    PyCapsule_SetName(cap, "used_dltensor");
    tensor_ = &legacy_->dl_tensor;
  } else {
    PAGEDLLM_CHECK_ARG(false, name << ".__dlpack__() did not return a DLPack capsule");
  }
  dtype_ = classify(tensor_->dtype);
}

Tensor::Tensor(Tensor&& other) noexcept
    : name_(other.name_),
      owner_(std::move(other.owner_)),
      borrowed_(other.borrowed_),
      tensor_(other.tensor_ == &other.borrowed_ ? &borrowed_ : other.tensor_),
      legacy_(other.legacy_),
      versioned_(other.versioned_),
      dtype_(other.dtype_),
      read_only_(other.read_only_) {
  other.tensor_ = nullptr;
  other.legacy_ = nullptr;
  other.versioned_ = nullptr;
}

Tensor::~Tensor() {
  if (legacy_ && legacy_->deleter) legacy_->deleter(legacy_);
  if (versioned_ && versioned_->deleter) versioned_->deleter(versioned_);
}

void* Tensor::data() const {
  return static_cast<char*>(tensor_->data) + tensor_->byte_offset;
}

int64_t Tensor::stride(int dim) const {
  if (tensor_->strides) return tensor_->strides[dim];
  int64_t s = 1;
  for (int i = tensor_->ndim - 1; i > dim; --i) s *= tensor_->shape[i];
  return s;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < tensor_->ndim; ++i) n *= tensor_->shape[i];
  return n;
}

std::string Tensor::describe() const {
  // pagedllm/error.h's Message, not an ostringstream: no iostream number formatting (on one GPU
  // machine's Python process that crashed; see error.h).
  detail::Message os;
  if (dtype_ == DType::kOther) {
    os << "dtype(code " << int(tensor_->dtype.code) << ", " << int(tensor_->dtype.bits)
       << " bits)[";
  } else {
    os << dtype_name(dtype_) << "[";
  }
  for (int i = 0; i < ndim(); ++i) os << (i ? ", " : "") << size(i);
  os << "] on " << device_name(tensor_->device.device_type);
  return os.str();
}

void Tensor::require_cpu() const {
  const int32_t type = tensor_->device.device_type;
  PAGEDLLM_CHECK_ARG(type == dlpack::kDLCPU || type == dlpack::kDLCUDAHost,
                     name_ << " is on " << device_name(type)
                           << "; these are the CPU kernels and take CPU tensors");
}

void Tensor::require_ndim(int n) const {
  PAGEDLLM_CHECK_ARG(ndim() == n, name_ << " must have " << n << " dimensions, got "
                                        << describe());
}

void Tensor::require_writable() const {
  PAGEDLLM_CHECK_ARG(!read_only_, name_ << " is read-only but the kernel writes into it");
}

void Tensor::require_inner_contiguous(int from) const {
  int64_t expected = 1;
  for (int i = ndim() - 1; i >= from; --i) {
    PAGEDLLM_CHECK_ARG(size(i) == 1 || stride(i) == expected,
                       name_ << " must be contiguous in its dims " << from << ".." << ndim() - 1
                             << " (dim " << i << " has stride " << stride(i) << ", expected "
                             << expected << "); call .contiguous()");
    expected *= size(i);
  }
}

}  // namespace pagedllm::python
