// AtomicFileWriter: a file written piece by piece into a temporary file, renamed into place
// once complete.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "remat/error.h"
#include "remat/io.h"

namespace remat {

AtomicFileWriter::AtomicFileWriter(const std::string& path) : path_(path) {
  std::random_device rd;
  tmp_ = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd() % 1000000);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) REMAT_THROW("cannot create ", tmp_, ": ", std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  REMAT_CHECK(fd_ >= 0, "AtomicFileWriter: ", path_, " is already committed");
  const auto* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      REMAT_THROW("cannot write ", path_, ": ", std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  REMAT_CHECK(fd_ >= 0, "AtomicFileWriter: ", path_, " is already committed");
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    REMAT_THROW("cannot write ", path_, ": ", std::strerror(e));
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    REMAT_THROW("cannot rename ", tmp_, " to ", path_, ": ", std::strerror(e));
  }
}

}  // namespace remat
