// EXPECT_REMAT_ERROR(statement, substring): the statement throws remat::Error whose
// message contains the substring.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "remat/error.h"

#define EXPECT_REMAT_ERROR(statement, substring)                                    \
  do {                                                                              \
    bool remat_thrown_ = false;                                                     \
    try {                                                                           \
      statement;                                                                    \
    } catch (const ::remat::Error& e) {                                             \
      remat_thrown_ = true;                                                         \
      EXPECT_NE(std::string(e.what()).find(substring), std::string::npos)           \
          << "message: " << e.what() << "\n  expected to contain: " << (substring); \
    }                                                                               \
    EXPECT_TRUE(remat_thrown_) << #statement " did not throw remat::Error";         \
  } while (0)
