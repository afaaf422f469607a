// remat::Error and the check macros every layer of remat uses.
//
// Every failure in remat is a remat::Error (a std::runtime_error). Its message() is what a
// user is told (the file, field, option and value at fault); its what() adds the place in
// remat's source for developers: the condition of a failed check and the file and line
// (relative to the repository). The remat command prints message() and logs the rest at
// REMAT_LOG=debug. CUDA, cuBLAS, cuDNN and cuRAND have their own macros in
// remat/cuda_check.h, which build on the same formatting.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace remat {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message), message_(message) {}
  // what() is message + source (" [check `cond` failed] (src/x.cpp:12)").
  Error(const std::string& message, const std::string& source)
      : std::runtime_error(message + source), message_(message), source_(source) {}
  // The message without the place in remat's source: what the user reads.
  const std::string& message() const noexcept { return message_; }
  // The failed check and the source file and line; empty for an Error made without them.
  const std::string& source() const noexcept { return source_; }

 private:
  std::string message_, source_;
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
[[noreturn]] void throw_check_error(const char* file, int line, const char* condition, const std::string& message);

}  // namespace detail
}  // namespace remat

// Throws remat::Error with the given message parts and the source location.
#define REMAT_THROW(...) ::remat::detail::throw_error(__FILE__, __LINE__, ::remat::detail::str_cat(__VA_ARGS__))

// Checks a condition that depends on user input or the environment.
#define REMAT_CHECK(cond, ...)                                                                              \
  do {                                                                                                      \
    if (!(cond)) {                                                                                          \
      ::remat::detail::throw_check_error(__FILE__, __LINE__, #cond, ::remat::detail::str_cat(__VA_ARGS__)); \
    }                                                                                                       \
  } while (0)
