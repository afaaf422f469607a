// remat::Error and the check macros every layer of remat uses.
//
// Every failure in remat is a remat::Error (a std::runtime_error) whose message names
// the place: the expression or condition, and the file and line (relative to the
// repository). CUDA, cuBLAS, cuDNN and cuRAND have their own macros in
// remat/cuda_check.h, which build on the same formatting.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace remat {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {

// Concatenates its arguments with operator<< (no format strings to get wrong).
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace detail
}  // namespace remat

// Throws remat::Error with the given message parts and the source location.
#define REMAT_THROW(...) ::remat::detail::throw_error(__FILE__, __LINE__, ::remat::detail::str_cat(__VA_ARGS__))

// Checks a condition that depends on user input or the environment.
#define REMAT_CHECK(cond, ...)                                                                              \
  do {                                                                                                      \
    if (!(cond)) {                                                                                          \
      ::remat::detail::throw_error(__FILE__, __LINE__,                                                      \
                                   ::remat::detail::str_cat(__VA_ARGS__, " [check `", #cond, "` failed]")); \
    }                                                                                                       \
  } while (0)
