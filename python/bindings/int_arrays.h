// int_arrays.h (bindings) — integer arrays from Python without silent truncation.
//
// Token ids, sequence ids, counts and hashes come in as anything numpy turns into an integer
// array (a list, a tuple, a numpy array, a CPU torch tensor). pybind11's forcecast would turn
// 1.9 into 1 and 2^32 + 5 into 5 (a false prefix-cache hit); int_array refuses instead:
// floats, bools and other non-integer dtypes are a ValueError naming the argument, and so is
// any value outside the target type's range (naming the argument, the index and the value).
// An array already of the target type and C-contiguous is used in place (the engine's path);
// any other integer array is range-checked and converted in one pass. An empty input of any
// dtype (`[]` is float64 to numpy) is an empty array.
// Thread-safety: call with the GIL held.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "pagedllm/error.h"

namespace pagedllm::python {

template <class T>
using IntArray = pybind11::array_t<T, pybind11::array::c_style>;

namespace detail {

// The name numpy gives T ("int32", "uint64").
template <class T>
const char* int_type_name() {
  if constexpr (std::is_same_v<T, int32_t>) return "int32";
  else if constexpr (std::is_same_v<T, int64_t>) return "int64";
  else if constexpr (std::is_same_v<T, uint64_t>) return "uint64";
  else return std::is_signed_v<T> ? "a signed integer" : "an unsigned integer";
}

// True when v is inside T's range (exact for every pair of integer types).
template <class T, class S>
bool fits(S v) {
  if constexpr (std::is_signed_v<S> == std::is_signed_v<T>) {
    return v >= std::numeric_limits<T>::min() && v <= std::numeric_limits<T>::max();
  } else if constexpr (std::is_signed_v<S>) {  // signed into unsigned
    return v >= 0 && static_cast<std::make_unsigned_t<S>>(v) <= std::numeric_limits<T>::max();
  } else {  // unsigned into signed
    return v <= static_cast<std::make_unsigned_t<T>>(std::numeric_limits<T>::max());
  }
}

template <class T>
[[noreturn]] void throw_out_of_range(const char* name, pybind11::ssize_t i, const std::string& v) {
  ::pagedllm::detail::Message m;
  m << name << "[" << i << "] = " << v << " is outside " << int_type_name<T>() << " ["
    << std::numeric_limits<T>::min() << ", " << std::numeric_limits<T>::max() << "]";
  ::pagedllm::detail::throw_error(ErrorKind::kInvalidArgument, __FILE__, __LINE__, m.str());
}

// Range-checks and converts the C-contiguous array `src` of element type S into `out`.
template <class T, class S>
void convert_checked(const pybind11::array& src, T* out, const char* name) {
  const S* in = static_cast<const S*>(src.data());
  const pybind11::ssize_t n = src.size();
  for (pybind11::ssize_t i = 0; i < n; ++i) {
    if (!fits<T>(in[i])) {
      ::pagedllm::detail::Message m;  // as a number (Message writes 1-byte types as chars)
      if constexpr (std::is_signed_v<S>) m << static_cast<long long>(in[i]);
      else m << static_cast<unsigned long long>(in[i]);
      throw_out_of_range<T>(name, i, m.str());
    }
    out[i] = static_cast<T>(in[i]);
  }
}

// An object array (Python ints numpy could not hold as int64 / uint64, or anything else):
// each element must be a Python int (not a bool) inside T's range.
template <class T>
void convert_objects(const pybind11::array& src, T* out, const char* name) {
  const pybind11::list items = src.attr("ravel")().attr("tolist")();
  pybind11::ssize_t i = 0;
  for (const pybind11::handle item : items) {
    PAGEDLLM_CHECK_ARG(PyLong_Check(item.ptr()) && !PyBool_Check(item.ptr()),
                       name << "[" << i << "] = " << std::string(pybind11::repr(item))
                            << " is not an integer (" << name << " must hold integers)");
    int overflow = 0;
    bool ok;
    if constexpr (std::is_signed_v<T>) {
      const long long v = PyLong_AsLongLongAndOverflow(item.ptr(), &overflow);
      ok = overflow == 0 && fits<T>(v);
      if (ok) out[i] = static_cast<T>(v);
    } else {
      const long long v = PyLong_AsLongLongAndOverflow(item.ptr(), &overflow);
      if (overflow == 0) {
        ok = fits<T>(v);
        if (ok) out[i] = static_cast<T>(v);
      } else {
        const unsigned long long u = overflow > 0 ? PyLong_AsUnsignedLongLong(item.ptr()) : 0;
        ok = overflow > 0 && !PyErr_Occurred() && fits<T>(u);
        PyErr_Clear();
        if (ok) out[i] = static_cast<T>(u);
      }
    }
    if (!ok) throw_out_of_range<T>(name, i, std::string(pybind11::str(item)));
    ++i;
  }
}

}  // namespace detail

// `obj` as a C-contiguous array of T (see the file comment); throws ValueError naming `name`
// for non-integer input or a value outside T's range.
template <class T>
IntArray<T> int_array(pybind11::handle obj, const char* name) {
  namespace py = pybind11;
  py::array a = py::array::ensure(obj);
  PAGEDLLM_CHECK_ARG(a, name << " must be an array of integers, got "
                             << std::string(py::str(py::type::of(obj).attr("__name__"))));
  std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
  if (a.size() == 0) return IntArray<T>(shape);
  const char kind = a.dtype().kind();
  PAGEDLLM_CHECK_ARG(kind == 'i' || kind == 'u' || kind == 'O',
                     name << " must hold integers (" << detail::int_type_name<T>()
                          << "), got dtype " << std::string(py::str(a.dtype()))
                          << (kind == 'f' || kind == 'c' ? ": ids are never rounded" : ""));
  if (a.dtype().equal(py::dtype::of<T>()) && (a.flags() & py::array::c_style)) {
    return py::reinterpret_borrow<IntArray<T>>(a);  // in place: no copy, nothing to check
  }
  IntArray<T> out(shape);
  T* dst = out.mutable_data();
  if (kind == 'O') {
    detail::convert_objects<T>(a, dst, name);
    return out;
  }
  // A C-contiguous, native-byte-order view of the input in its own kind and size (a copy only
  // for a strided or byte-swapped input).
  if (a.dtype().byteorder() == '>' || a.dtype().byteorder() == '<') {
    const py::dtype native = a.dtype().attr("newbyteorder")("=");
    if (!native.equal(a.dtype())) a = a.attr("astype")(native);
  }
  const py::array src = py::array::ensure(a, py::array::c_style);
  PAGEDLLM_CHECK_ARG(src, name << ": cannot read the array");
  const auto size = a.dtype().itemsize();
  if (kind == 'i') {
    switch (size) {
      case 1: detail::convert_checked<T, int8_t>(src, dst, name); return out;
      case 2: detail::convert_checked<T, int16_t>(src, dst, name); return out;
      case 4: detail::convert_checked<T, int32_t>(src, dst, name); return out;
      case 8: detail::convert_checked<T, int64_t>(src, dst, name); return out;
    }
  } else {
    switch (size) {
      case 1: detail::convert_checked<T, uint8_t>(src, dst, name); return out;
      case 2: detail::convert_checked<T, uint16_t>(src, dst, name); return out;
      case 4: detail::convert_checked<T, uint32_t>(src, dst, name); return out;
      case 8: detail::convert_checked<T, uint64_t>(src, dst, name); return out;
    }
  }
  ::pagedllm::detail::Message m;
  m << name << ": unsupported integer dtype " << std::string(py::str(a.dtype()));
  ::pagedllm::detail::throw_error(ErrorKind::kInvalidArgument, __FILE__, __LINE__, m.str());
}

}  // namespace pagedllm::python
