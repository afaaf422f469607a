// MappedFile: a read-only mmap of a whole file, with release() to drop pages a reader is
// done with from the resident set.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "remat/error.h"
#include "remat/io.h"

namespace remat {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) REMAT_THROW("cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    REMAT_THROW("cannot stat ", path, ": ", std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    REMAT_THROW("cannot map ", path, ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      REMAT_THROW("cannot map ", path, " (", size_, " bytes): ", std::strerror(e));
    }
    data_ = static_cast<const unsigned char*>(p);
    // Readers walk the file front to back: let the kernel read ahead.
    ::madvise(p, size_, MADV_SEQUENTIAL);
  }
  ::close(fd);  // the mapping keeps the file
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
}

void MappedFile::release(size_t begin, size_t end) const {
  if (!data_ || begin >= end) return;
  end = std::min(end, size_);
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t first = (begin + page - 1) / page * page;  // whole pages only: neighbours may still be read
  const size_t last = end == size_ ? (end + page - 1) / page * page : end / page * page;
  if (first >= last) return;
  ::madvise(const_cast<unsigned char*>(data_) + first, last - first, MADV_DONTNEED);
}

}  // namespace remat
