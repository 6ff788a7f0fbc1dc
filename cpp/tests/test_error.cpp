// The check macros' messages (pagedllm/error.h): the kind, the source location, and numbers
// written the same whatever global locale the host process has set.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <locale>
#include <string>

#include "pagedllm/error.h"

namespace {

// The message of the pagedllm::Error that f throws (fails the test when none is thrown).
template <class F>
std::string message_of(F&& f, pagedllm::ErrorKind expected) {
  try {
    f();
  } catch (const pagedllm::Error& e) {
    EXPECT_EQ(e.kind(), expected);
    return e.what();
  }
  ADD_FAILURE() << "no pagedllm::Error thrown";
  return "";
}

// A numpunct that groups digits in threes with ',' and writes ';' for the decimal point, as
// a process that set a regional locale as the global one would format numbers in an ostream.
struct Grouping : std::numpunct<char> {
  char do_thousands_sep() const override { return ','; }
  char do_decimal_point() const override { return ';'; }
  std::string do_grouping() const override { return "\3"; }
};

// Restores the global locale when the test ends.
struct GlobalLocale {
  explicit GlobalLocale(const std::locale& l) : old(std::locale::global(l)) {}
  ~GlobalLocale() { std::locale::global(old); }
  std::locale old;
};

TEST(ErrorMessage, KindTextNumbersAndLocation) {
  const std::string m = message_of(
      [] {
        const int64_t id = 1234567;
        PAGEDLLM_CHECK_INDEX(false, "block " << id << " of " << 16u << " (scale " << 0.125
                                             << ", " << 1.0f / 3 << ") " << std::string("end")
                                             << ' ' << true << ' ' << -7);
      },
      pagedllm::ErrorKind::kOutOfRange);
  const std::string text = "block 1234567 of 16 (scale 0.125, 0.333333) end 1 -7";
  EXPECT_EQ(m.substr(0, text.size()), text);
  EXPECT_EQ(m.substr(text.size(), 17), " [test_error.cpp:");  // the base name and the line
  EXPECT_EQ(m.back(), ']');
}

TEST(ErrorMessage, NumbersIgnoreTheGlobalLocale) {
  GlobalLocale grouping(std::locale(std::locale::classic(), new Grouping));
  const std::string m = message_of(
      [] { PAGEDLLM_CHECK_ARG(false, "n = " << 1048576 << ", x = " << 2.5); },
      pagedllm::ErrorKind::kInvalidArgument);
  EXPECT_EQ(m.substr(0, m.find(" [")), "n = 1048576, x = 2.5");
}

TEST(ErrorMessage, ExtremesAndSpecialValues) {
  const std::string m = message_of(
      [] {
        PAGEDLLM_CHECK_STATE(false, std::numeric_limits<int64_t>::min()
                                        << ' ' << std::numeric_limits<uint64_t>::max() << ' '
                                        << std::numeric_limits<float>::infinity() << ' '
                                        << -std::numeric_limits<double>::infinity() << ' '
                                        << 1e-30 << ' ' << static_cast<const char*>(nullptr));
      },
      pagedllm::ErrorKind::kInvalidState);
  EXPECT_EQ(m.substr(0, m.find(" [")),
            "-9223372036854775808 18446744073709551615 inf -inf 1e-30 (null)");
}

}  // namespace
