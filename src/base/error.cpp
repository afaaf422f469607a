#include "remat/error.h"

#include <cstring>

namespace remat::detail {

namespace {
// Source paths reach us absolute-with-prefix-map ("src/x.cpp") or relative to a build
// folder when ccache rewrites them ("../../src/x.cpp"): report them from the repository.
const char* repo_relative(const char* file) {
  for (;;) {
    if (std::strncmp(file, "../", 3) == 0)
      file += 3;
    else if (std::strncmp(file, "./", 2) == 0)
      file += 2;
    else
      return file;
  }
}
}  // namespace

void throw_error(const char* file, int line, const std::string& message) {
  throw Error(message, str_cat(" (", repo_relative(file), ":", line, ")"));
}

void throw_check_error(const char* file, int line, const char* condition, const std::string& message) {
  throw Error(message, str_cat(" [check `", condition, "` failed] (", repo_relative(file), ":", line, ")"));
}

}  // namespace remat::detail
