// pagedllm/error.h — the one exception type of the core, and the check macros.
//
// Bad input (a wrong shape, an out-of-range id, a double free) throws pagedllm::Error with a
// message naming the thing that is wrong and what was expected. The kind tells the binding
// layer which Python exception to raise (ValueError, IndexError, RuntimeError, OSError). Running out of
// memory blocks is never an exception: it is a normal result (false / std::nullopt).
// Internal invariants use PAGEDLLM_ASSERT, compiled in unless NDEBUG is set.
// Thread-safety: stateless; safe from any thread.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace pagedllm {

enum class ErrorKind {
  kInvalidArgument,  // a value of the wrong shape, type or range -> ValueError
  kOutOfRange,       // an index / id outside its container      -> IndexError
  kInvalidState,     // a call that the object's state forbids    -> RuntimeError
  kIo,               // a file or directory that cannot be used   -> OSError
};

class Error : public std::runtime_error {
 public:
  // Builds an error of the given kind; `what()` is the full message.
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  // The category that decides the Python exception type.
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
// Throws an Error whose message is prefixed with the source location (used by the macros).
[[noreturn]] void throw_error(ErrorKind kind, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace pagedllm

// PAGEDLLM_CHECK(cond, kind, stream-expr): throws pagedllm::Error(kind) when cond is false.
#define PAGEDLLM_CHECK_KIND(cond, kind, msg)                                        \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::ostringstream pagedllm_oss_;                                             \
      pagedllm_oss_ << msg;                                                         \
      ::pagedllm::detail::throw_error((kind), __FILE__, __LINE__, pagedllm_oss_.str()); \
    }                                                                               \
  } while (0)

#define PAGEDLLM_CHECK_ARG(cond, msg) \
  PAGEDLLM_CHECK_KIND(cond, ::pagedllm::ErrorKind::kInvalidArgument, msg)
#define PAGEDLLM_CHECK_INDEX(cond, msg) \
  PAGEDLLM_CHECK_KIND(cond, ::pagedllm::ErrorKind::kOutOfRange, msg)
#define PAGEDLLM_CHECK_STATE(cond, msg) \
  PAGEDLLM_CHECK_KIND(cond, ::pagedllm::ErrorKind::kInvalidState, msg)
#define PAGEDLLM_CHECK_IO(cond, msg) PAGEDLLM_CHECK_KIND(cond, ::pagedllm::ErrorKind::kIo, msg)

#ifdef NDEBUG
#define PAGEDLLM_ASSERT(cond) ((void)0)
#else
#define PAGEDLLM_ASSERT(cond) \
  PAGEDLLM_CHECK_KIND(cond, ::pagedllm::ErrorKind::kInvalidState, "internal invariant failed: " #cond)
#endif
