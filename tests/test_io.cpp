// safetensors and atomic writes: round trips, and crafted files rejected before any
// out-of-bounds read or allocation.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "remat/io.h"
#include "support/expect_error.h"
#include "support/golden.h"

using remat::SafetensorsFile;
using remat::Tensor;

namespace {

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("remat_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string with_header(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json + data;
}

}  // namespace

TEST(Safetensors, RoundTrip) {
  Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor ids = Tensor::from_ints({7, -1, 3}, {3});
  Tensor scalar = Tensor::from_vector({2.5f}, remat::Shape{});
  const std::string path = tmp_path("rt.safetensors");
  remat::save_safetensors(path, {{"a", a}, {"ids", ids}, {"s", scalar}}, {{"step", "12"}});
  SafetensorsFile f = SafetensorsFile::load(path);
  EXPECT_EQ(f.entries().size(), 3u);
  EXPECT_EQ(f.metadata().at("step"), "12");
  EXPECT_TRUE(remat::test::bitwise_equal(f.tensor("a"), a));
  EXPECT_EQ(f.tensor("ids").to_ints(), (std::vector<int32_t>{7, -1, 3}));
  EXPECT_EQ(f.tensor("s").rank(), 0);
  EXPECT_REMAT_ERROR(f.tensor("missing"), "no tensor named \"missing\"");
  std::filesystem::remove(path);
}

TEST(Safetensors, CraftedFilesAreRejected) {
  auto bad = [](const std::string& bytes, const char* msg) {
    EXPECT_REMAT_ERROR(SafetensorsFile::parse(bytes, "x.safetensors"), msg);
  };
  bad("abc", "shorter than the 8-byte header size");
  bad(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "exceeds 100 MiB");
  bad(with_header("{}", "").substr(0, 8) + "{", "header size 2 runs past the end");
  bad(with_header("[1,2]", ""), "not a JSON object");
  bad(with_header("{not json", ""), "header is not JSON");
  bad(with_header(R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')),
      "unsupported dtype F64");
  bad(with_header(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(4, '\0')),
      "outside the data section");
  bad(with_header(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
      "8 bytes of data for shape [3]");
  bad(with_header(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                  std::string(8, '\0')),
      "shape overflows");
  bad(with_header(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0')),
      "non-negative integers");
  bad(with_header(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          std::string(12, '\0')),
      "overlap");
  // An empty tensor between two overlapping ones must not hide the overlap.
  bad(with_header(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},"c":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          std::string(12, '\0')),
      "overlap");
  bad(with_header(R"({"t":{"dtype":"F32","shape":[1,1,1,1,1,1],"data_offsets":[0,4]}})", std::string(4, '\0')),
      "at most 5 dims");
  bad(with_header(R"({"t":{"dtype":"F32","shape":[1]}})", ""), "needs dtype, shape and data_offsets");
  bad(with_header(R"({"__metadata__":{"k":1}})", ""), "is not a string");
}

TEST(Safetensors, MissingFileNamesThePath) {
  EXPECT_REMAT_ERROR(SafetensorsFile::load("/nonexistent/w.safetensors"), "cannot open /nonexistent/w.safetensors");
}

TEST(AtomicWrite, ReplacesWholeFileAndLeavesNoTemporaries) {
  const auto dir = std::filesystem::path(tmp_path("dir"));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "f.bin").string();
  remat::write_file_atomic(path, "first");
  remat::write_file_atomic(path, "second version");
  EXPECT_EQ(remat::read_file(path), "second version");
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  EXPECT_REMAT_ERROR(remat::write_file_atomic((dir / "no/such/dir/f").string(), "x"), "cannot create");
  std::filesystem::remove_all(dir);
}
