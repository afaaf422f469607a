// Logging through spdlog: one logger named "remat".
//
// The level comes from REMAT_LOG (trace, debug, info, warn, error, off; default info).
// Tests swap the sink for a capturing one (capture_log) so that warnings can be asserted.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace remat {

// The remat logger (created on first use, level from REMAT_LOG).
spdlog::logger& log();

// Replaces the logger's sinks with one that records messages in memory; restores the
// previous sinks when destroyed. Not thread-safe against concurrent construction.
class LogCapture {
 public:
  LogCapture();
  ~LogCapture();
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  struct Record {
    spdlog::level::level_enum level;
    std::string message;
  };
  std::vector<Record> records() const;
  // Number of records at `level` or above.
  size_t count_at_least(spdlog::level::level_enum level) const;

 private:
  struct Sink;
  std::shared_ptr<Sink> sink_;
  std::vector<spdlog::sink_ptr> saved_;
  spdlog::level::level_enum saved_level_;
};

}  // namespace remat
