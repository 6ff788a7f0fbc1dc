// pagedllm/error.h — the one exception type of the core, and the check macros.
//
// Bad input (a wrong shape, an out-of-range id, a double free) throws pagedllm::Error with a
// message naming the thing that is wrong and what was expected. The kind tells the binding
// layer which Python exception to raise (ValueError, IndexError, RuntimeError, OSError). Running out of
// memory blocks is never an exception: it is a normal result (false / std::nullopt).
// Internal invariants use PAGEDLLM_ASSERT, compiled in unless NDEBUG is set.
// Thread-safety: stateless; safe from any thread.
#pragma once

#include <charconv>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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

// The text of a check's message, built with `<<` as with an ostream but without iostreams or
// locales: numbers are written by std::to_chars, so they read the same whatever global locale
// the host process set (an ostream would group "1,024" under en_US), and a process whose
// iostream number formatting is broken still gets them (a GPU machine's Python process printed
// "block_tables[][] =  is outside the pool [0, )" through an ostringstream). Integers in
// decimal, floating point as printf's %g (6 significant digits, an ostream's default), chars as
// characters, pointers in hex.
class Message {
 public:
  // Appends text.
  Message& operator<<(std::string_view s) {
    text_.append(s.data(), s.size());
    return *this;
  }
  // Appends a C string ("(null)" for a null pointer).
  Message& operator<<(const char* s) { return *this << std::string_view(s ? s : "(null)"); }
  // Appends a string.
  Message& operator<<(const std::string& s) { return *this << std::string_view(s); }
  // Appends a character (char, signed char and unsigned char, as an ostream does).
  Message& operator<<(char c) {
    text_.push_back(c);
    return *this;
  }
  Message& operator<<(signed char c) { return *this << static_cast<char>(c); }
  Message& operator<<(unsigned char c) { return *this << static_cast<char>(c); }
  // Appends 1 or 0 (an ostream's default for bool).
  Message& operator<<(bool b) { return *this << (b ? '1' : '0'); }
  // Appends an integer in decimal.
  template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  Message& operator<<(T v) {
    char buf[24];
    return append(std::to_chars(buf, buf + sizeof(buf), v), buf);
  }
  // Appends a floating-point value as %g (6 significant digits).
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Message& operator<<(T v) {
    char buf[64];
    return append(std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::general, 6), buf);
  }
  // Appends a pointer as 0x and its address in hex.
  Message& operator<<(const void* p) {
    char buf[24];
    *this << "0x";
    return append(std::to_chars(buf, buf + sizeof(buf), reinterpret_cast<std::uintptr_t>(p), 16),
                  buf);
  }
  // The message so far.
  const std::string& str() const { return text_; }

 private:
  Message& append(std::to_chars_result r, const char* buf) {
    if (r.ec == std::errc()) text_.append(buf, static_cast<std::size_t>(r.ptr - buf));
    return *this;
  }
  std::string text_;
};
}  // namespace detail

}  // namespace pagedllm

// PAGEDLLM_CHECK(cond, kind, stream-expr): throws pagedllm::Error(kind) when cond is false.
#define PAGEDLLM_CHECK_KIND(cond, kind, msg)                                        \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      ::pagedllm::detail::Message pagedllm_msg_;                                    \
      pagedllm_msg_ << msg;                                                         \
      ::pagedllm::detail::throw_error((kind), __FILE__, __LINE__, pagedllm_msg_.str()); \
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
