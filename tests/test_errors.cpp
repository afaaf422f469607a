// remat::Error messages name the place; logging can be captured.
#include <gtest/gtest.h>

#include "remat/error.h"
#include "remat/log.h"
#include "support/expect_error.h"

TEST(Errors, CheckMessageNamesConditionAndRelativeFile) {
  try {
    int batch = 0;
    REMAT_CHECK(batch > 0, "batch must be positive, got ", batch);
    FAIL() << "did not throw";
  } catch (const remat::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("batch must be positive, got 0"), std::string::npos) << m;
    EXPECT_NE(m.find("`batch > 0`"), std::string::npos) << m;
    EXPECT_NE(m.find("(tests/test_errors.cpp:"), std::string::npos) << m;  // relative path
  }
  EXPECT_REMAT_ERROR(REMAT_THROW("bad ", 3, " thing"), "bad 3 thing");
}

// What a user reads is message(): no source file, no check text; what() keeps them for
// developers (the remat command logs source() at REMAT_LOG=debug).
TEST(Errors, MessageLeavesTheSourceToWhatAndSource) {
  try {
    int batch = 0;
    REMAT_CHECK(batch > 0, "batch must be positive, got ", batch);
    FAIL() << "did not throw";
  } catch (const remat::Error& e) {
    EXPECT_EQ(e.message(), "batch must be positive, got 0");
    EXPECT_EQ(e.source().find(" [check `batch > 0` failed] (tests/test_errors.cpp:"), 0u) << e.source();
    EXPECT_EQ(std::string(e.what()), e.message() + e.source());
  }
  try {
    REMAT_THROW("bad ", 3, " thing");
  } catch (const remat::Error& e) {
    EXPECT_EQ(e.message(), "bad 3 thing");
    EXPECT_EQ(e.source().find(" (tests/test_errors.cpp:"), 0u) << e.source();
  }
  const remat::Error plain("made by hand");
  EXPECT_EQ(plain.message(), "made by hand");
  EXPECT_EQ(plain.source(), "");
}

TEST(Errors, ErrorIsARuntimeError) { EXPECT_THROW(REMAT_THROW("x"), std::runtime_error); }

TEST(Logging, CaptureSeesWarnings) {
  remat::LogCapture capture;
  remat::log().warn("unused key {} in {}", "/model/foo", "models/x.json");
  remat::log().debug("details");
  ASSERT_EQ(capture.records().size(), 2u);
  EXPECT_EQ(capture.records()[0].message, "unused key /model/foo in models/x.json");
  EXPECT_EQ(capture.count_at_least(spdlog::level::warn), 1u);
}
