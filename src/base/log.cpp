#include "remat/log.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace remat {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = std::make_shared<spdlog::logger>("remat", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    l->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    spdlog::level::level_enum level = spdlog::level::info;
    if (const char* env = std::getenv("REMAT_LOG")) level = spdlog::level::from_str(env);
    l->set_level(level);
    return l;
  }();
  return *logger;
}

struct LogCapture::Sink : spdlog::sinks::base_sink<std::mutex> {
  std::vector<Record> records;
  mutable std::mutex records_mutex;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::lock_guard<std::mutex> lock(records_mutex);
    records.push_back({msg.level, std::string(msg.payload.begin(), msg.payload.end())});
  }
  void flush_() override {}
};

LogCapture::LogCapture() : sink_(std::make_shared<Sink>()) {
  auto& l = log();
  saved_ = l.sinks();
  saved_level_ = l.level();
  l.sinks().clear();
  l.sinks().push_back(sink_);
  l.set_level(spdlog::level::trace);
}

LogCapture::~LogCapture() {
  auto& l = log();
  l.sinks() = saved_;
  l.set_level(saved_level_);
}

std::vector<LogCapture::Record> LogCapture::records() const {
  std::lock_guard<std::mutex> lock(sink_->records_mutex);
  return sink_->records;
}

size_t LogCapture::count_at_least(spdlog::level::level_enum level) const {
  size_t n = 0;
  for (const auto& r : records()) n += r.level >= level ? 1 : 0;
  return n;
}

}  // namespace remat
