#include "remat/error.h"

namespace remat::detail {

void throw_error(const char* file, int line, const std::string& message) {
  throw Error(str_cat(message, " (", file, ":", line, ")"));
}

}  // namespace remat::detail
