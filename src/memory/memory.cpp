#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>

#include "remat/device_registry.h"
#include "remat/error.h"
#include "remat/log.h"
#include "remat/memory.h"

namespace remat {

const char* category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::parameter: return "parameter";
    case MemoryCategory::gradient: return "gradient";
    case MemoryCategory::optimizer_state: return "optimizer_state";
    case MemoryCategory::activation: return "activation";
    case MemoryCategory::workspace: return "workspace";
    case MemoryCategory::temporary: return "temporary";
    case MemoryCategory::input: return "input";
  }
  return "?";
}

MemoryCategory parse_category(const std::string& s) {
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    auto c = static_cast<MemoryCategory>(i);
    if (s == category_name(c)) return c;
  }
  REMAT_THROW("unknown memory category \"", s, "\"");
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::setup: return "setup";
    case Phase::forward: return "forward";
    case Phase::recompute: return "recompute";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
  }
  return "?";
}

int64_t CategoryCounts::total() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

// ---------------------------------------------------------------------------
// Tag scopes
// ---------------------------------------------------------------------------

namespace {
thread_local AllocTag t_current_tag;
}

const AllocTag& current_tag() { return t_current_tag; }

TagScope::TagScope(MemoryCategory category, std::string owner, Phase phase)
    : TagScope(AllocTag{category, std::move(owner), phase}) {}

TagScope::TagScope(AllocTag tag) : saved_(std::move(t_current_tag)) { t_current_tag = std::move(tag); }

TagScope::~TagScope() { t_current_tag = std::move(saved_); }

// ---------------------------------------------------------------------------
// Raw allocators
// ---------------------------------------------------------------------------

namespace {

int64_t host_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : std::numeric_limits<int64_t>::max();
}

class CpuRawAllocator final : public RawAllocator {
 public:
  void* allocate(size_t bytes) override {
    // 64-byte alignment: a cache line, and enough for any vector load.
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
  int64_t capacity() const override { return host_memory_bytes(); }
#if defined(__SANITIZE_ADDRESS__)
  bool guards_each_allocation() const override { return true; }  // AddressSanitizer bounds each
#endif
};

// Hands out distinct fake addresses; nothing may dereference them.
class MetaRawAllocator final : public RawAllocator {
 public:
  void* allocate(size_t bytes) override {
    uintptr_t p = next_;
    next_ += (bytes + 4095) / 4096 * 4096 + 4096;
    return reinterpret_cast<void*>(p);
  }
  void deallocate(void*, size_t) override {}
  bool has_data() const override { return false; }
  int64_t capacity() const override { return int64_t{1} << 60; }

 private:
  uintptr_t next_ = 0x10000;
};

// First fit over the free ranges of its chunks, neighbours merged when returned.
class ChunkedRawAllocator final : public RawAllocator {
 public:
  static constexpr size_t kAlign = 256;
  ChunkedRawAllocator(std::function<void*(size_t)> get, std::function<void(void*)> put, size_t chunk)
      : get_(std::move(get)), put_(std::move(put)), chunk_(std::max<size_t>(chunk, kAlign)) {}
  ~ChunkedRawAllocator() override {
    for (void* c : chunks_) put_(c);
  }
  void* allocate(size_t bytes) override {
    bytes = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < bytes) continue;
      const uintptr_t p = it->first;
      const size_t left = it->second - bytes;
      free_.erase(it);
      if (left) free_[p + bytes] = left;
      return reinterpret_cast<void*>(p);
    }
    const size_t size = std::max(bytes, (chunk_ + kAlign - 1) / kAlign * kAlign);
    void* c = get_(size);
    if (!c) return nullptr;
    chunks_.push_back(c);
    const auto p = reinterpret_cast<uintptr_t>(c);
    if (size > bytes) free_[p + bytes] = size - bytes;
    return c;
  }
  void deallocate(void* ptr, size_t bytes) override {
    bytes = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    auto p = reinterpret_cast<uintptr_t>(ptr);
    auto next = free_.lower_bound(p);
    if (next != free_.end() && p + bytes == next->first) {  // merge with the range after
      bytes += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {  // ... and the one before
      auto prev = std::prev(next);
      if (prev->first + prev->second == p) {
        prev->second += bytes;
        return;
      }
    }
    free_[p] = bytes;
  }
  int64_t capacity() const override { return host_memory_bytes(); }

 private:
  std::function<void*(size_t)> get_;
  std::function<void(void*)> put_;
  size_t chunk_;
  std::vector<void*> chunks_;
  std::map<uintptr_t, size_t> free_;  // address -> bytes (adjacent ranges of one chunk merged)
};

}  // namespace

std::unique_ptr<RawAllocator> make_chunked_raw_allocator(std::function<void*(size_t)> get,
                                                         std::function<void(void*)> put, size_t chunk) {
  return std::make_unique<ChunkedRawAllocator>(std::move(get), std::move(put), chunk);
}

std::unique_ptr<RawAllocator> make_cpu_raw_allocator() { return std::make_unique<CpuRawAllocator>(); }
std::unique_ptr<RawAllocator> make_meta_raw_allocator() { return std::make_unique<MetaRawAllocator>(); }

// ---------------------------------------------------------------------------
// CachingAllocator
// ---------------------------------------------------------------------------

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<RawAllocator> raw)
    : device_(device), raw_(std::move(raw)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t leaked = 0, leaked_bytes = 0;
  for (auto& [ptr, block] : blocks_) {
    if (block->in_use) {
      ++leaked;
      leaked_bytes += static_cast<int64_t>(block->rounded);
      log().error("memory leak on {}: {} bytes ({}, owner \"{}\", {}) never freed", device_.str(), block->requested,
                  category_name(block->category), owners_[block->owner], phase_name(block->phase));
      continue;  // storage still points at it: do not free under its feet
    }
    // A segment goes back whole; a free piece of it stays with the leaked block beside it.
    if (block->segment && !block->prev && !block->next) raw_->deallocate(block->segment, block->size);
  }
  if (leaked)
    log().error("{} allocation(s), {} bytes, still live at teardown of the {} allocator", leaked, leaked_bytes,
                device_.str());
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) return kRounding;
  REMAT_CHECK(bytes <= std::numeric_limits<size_t>::max() - kRounding, "allocation size ", bytes, " overflows");
  return (bytes + kRounding - 1) / kRounding * kRounding;
}

uint32_t CachingAllocator::intern_owner(const std::string& name) {
  auto it = owner_ids_.find(name);
  if (it != owner_ids_.end()) return it->second;
  auto id = static_cast<uint32_t>(owners_.size());
  owners_.push_back(name);
  owner_ids_.emplace(name, id);
  owner_stats_.emplace_back();
  return id;
}

void CachingAllocator::record(MemoryEvent::Kind kind, int64_t bytes, const Block& b) {
  if (!log_events_) return;
  MemoryEvent e;
  e.seq = clock_ ? clock_->event_count() : seq_++;
  e.alloc_id = b.alloc_id;
  e.kind = kind;
  e.bytes = bytes;
  e.category = b.category;
  e.phase = b.phase;
  e.owner = b.owner;
  e.allocated_after = stats_.allocated;
  e.reserved_after = stats_.reserved;
  events_.push_back(e);
}

// Only whole segments go back: a free piece of a segment that still serves a request stays.
void CachingAllocator::release_cached_locked() {
  for (auto it = free_blocks_.begin(); it != free_blocks_.end();) {
    Block* block = it->second;
    if (block->prev || block->next) {
      ++it;
      continue;
    }
    raw_->deallocate(block->segment, block->size);
    stats_.reserved -= static_cast<int64_t>(block->size);
    stats_.num_raw_frees++;
    record(MemoryEvent::Kind::raw_free, static_cast<int64_t>(block->size), *block);
    it = free_blocks_.erase(it);
    retire_block_locked(block);
  }
}

// A Block to fill in: a spare one, or a new one (blocks_ owns both).
Block* CachingAllocator::new_block_locked() {
  if (!spare_blocks_.empty()) {
    Block* b = spare_blocks_.back();
    spare_blocks_.pop_back();
    return b;
  }
  auto owned = std::make_unique<Block>();
  Block* b = owned.get();
  blocks_.emplace(b, std::move(owned));
  return b;
}

// A Block no longer in use or cached (merged into a neighbour, or its segment released)
// waits for the next split: no allocation per split and merge.
void CachingAllocator::retire_block_locked(Block* block) {
  *block = Block{};
  spare_blocks_.push_back(block);
}

void CachingAllocator::cache_locked(Block* block) { block->cached = free_blocks_.emplace(block->size, block); }

void CachingAllocator::uncache_locked(Block* block) { free_blocks_.erase(block->cached); }

// Cuts `block` (taken from the cache) to its first `bytes`; the rest becomes a cached block
// of the same segment, after it.
Block* CachingAllocator::split_locked(Block* block, size_t bytes) {
  Block* r = new_block_locked();
  r->segment = block->segment;
  r->offset = block->offset + bytes;
  r->size = block->size - bytes;
  r->ptr = static_cast<char*>(block->segment) + r->offset;
  r->prev = block;
  r->next = block->next;
  if (block->next) block->next->prev = r;
  block->next = r;
  block->size = bytes;
  cache_locked(r);
  stats_.num_splits++;
  return block;
}

void CachingAllocator::throw_oom(size_t bytes, const AllocTag& tag) {
  int64_t cap = limit_ > 0 ? std::min(limit_, raw_->capacity()) : raw_->capacity();
  REMAT_THROW("out of memory on ", device_.str(), ": tried to allocate ", format_bytes(static_cast<int64_t>(bytes)),
              " (", bytes, " bytes; category ", category_name(tag.category), ", owner \"", tag.owner, "\", phase ",
              phase_name(tag.phase), "); allocated ", format_bytes(stats_.allocated), ", reserved ",
              format_bytes(stats_.reserved), ", limit ", format_bytes(cap));
}

Block* CachingAllocator::allocate(size_t bytes, const AllocTag& tag) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t rounded = round_size(bytes);
  Block* block = nullptr;
  bool fresh = false;

  // Best fit among cached blocks: the smallest that holds the request, taken whole if it
  // wastes at most a quarter of the request, else split (the rest stays cached).
  if (auto it = free_blocks_.lower_bound(rounded); it != free_blocks_.end()) {
    block = it->second;
    uncache_locked(block);
    if (block->size - rounded > rounded / kMaxSlackDivisor) split_locked(block, rounded);
    stats_.num_cache_hits++;
  }
  if (!block) {
    const int64_t cap = limit_ > 0 ? std::min(limit_, raw_->capacity()) : raw_->capacity();
    auto fits = [&] {
      return rounded <= static_cast<size_t>(cap) && stats_.reserved <= cap - static_cast<int64_t>(rounded);
    };
    void* ptr = nullptr;
    if (fits()) ptr = raw_->allocate(rounded);
    if (!ptr && !free_blocks_.empty()) {  // give cached memory back and retry once
      release_cached_locked();
      if (fits()) ptr = raw_->allocate(rounded);
    }
    if (!ptr) throw_oom(bytes, tag);
    block = new_block_locked();
    block->ptr = ptr;
    block->segment = ptr;
    block->size = rounded;
    stats_.reserved += static_cast<int64_t>(rounded);
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    stats_.num_raw_allocs++;
    fresh = true;
  }

  if ((block->prev || block->next) && raw_->guards_each_allocation()) {
    // A piece of a split segment, served from raw memory of its own, the request's size,
    // so that the raw allocator's bounds check sees its end (the accounting is the piece's).
    block->own_raw = raw_->allocate(rounded);
    if (!block->own_raw) {
      block->in_use = true;
      return_to_cache_locked(block);
      throw_oom(bytes, tag);
    }
    block->ptr = block->own_raw;
  }
  block->rounded = rounded;
  block->requested = bytes;
  block->category = tag.category;
  block->phase = tag.phase;
  block->owner = intern_owner(tag.owner);
  block->alloc_id = next_alloc_id_++;
  block->in_use = true;
  if (fresh) record(MemoryEvent::Kind::raw_alloc, static_cast<int64_t>(block->size), *block);

  const auto r = static_cast<int64_t>(rounded);
  stats_.allocated += r;
  stats_.requested += static_cast<int64_t>(bytes);
  stats_.num_allocs++;
  stats_.live_blocks++;
  stats_.by_category[tag.category] += r;
  stats_.peak_by_category[tag.category] =
      std::max(stats_.peak_by_category[tag.category], stats_.by_category[tag.category]);
  if (stats_.allocated > stats_.peak_allocated) {
    stats_.peak_allocated = stats_.allocated;
    stats_.by_category_at_peak = stats_.by_category;
  }
  OwnerStats& os = owner_stats_[block->owner];
  os.current += r;
  os.peak = std::max(os.peak, os.current);
  os.total += r;
  os.count++;
  record(MemoryEvent::Kind::alloc, r, *block);
  return block;
}

void CachingAllocator::free(Block* block) {
  if (!block) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(block);
  REMAT_CHECK(it != blocks_.end() && block->in_use, "free of a block that ", device_.str(),
              "'s allocator does not hold (double free?)");
  const auto r = static_cast<int64_t>(block->rounded);
  stats_.allocated -= r;
  stats_.requested -= static_cast<int64_t>(block->requested);
  stats_.num_frees++;
  stats_.live_blocks--;
  stats_.by_category[block->category] -= r;
  owner_stats_[block->owner].current -= r;
  record(MemoryEvent::Kind::free, r, *block);
  return_to_cache_locked(block);
}

// Caches a block just released, merged with the free blocks beside it in its segment.
void CachingAllocator::return_to_cache_locked(Block* block) {
  block->in_use = false;
  if (block->own_raw) {
    raw_->deallocate(block->own_raw, block->rounded);
    block->own_raw = nullptr;
  }
  auto join = [&](Block* left, Block* right) {  // right's bytes become left's
    left->size += right->size;
    left->next = right->next;
    if (left->next) left->next->prev = left;
    retire_block_locked(right);
  };
  if (Block* p = block->prev; p && !p->in_use) {
    uncache_locked(p);
    join(p, block);
    block = p;
  }
  if (Block* n = block->next; n && !n->in_use) {
    uncache_locked(n);
    join(block, n);
  }
  block->ptr = static_cast<char*>(block->segment) + block->offset;
  cache_locked(block);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

void CachingAllocator::set_limit(int64_t bytes) {
  REMAT_CHECK(bytes >= 0, "memory limit must be non-negative, got ", bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  limit_ = bytes;
}

int64_t CachingAllocator::limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return limit_;
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
  stats_.peak_by_category = stats_.by_category;
  stats_.by_category_at_peak = stats_.by_category;
  for (auto& os : owner_stats_) os.peak = os.current;
}

std::map<std::string, OwnerStats> CachingAllocator::owner_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, OwnerStats> out;
  for (size_t i = 0; i < owners_.size(); ++i)
    if (owner_stats_[i].count > 0) out[owners_[i]] = owner_stats_[i];
  return out;
}

void CachingAllocator::set_event_logging(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  log_events_ = on;
}

void CachingAllocator::set_event_clock(const CachingAllocator* clock) {
  REMAT_CHECK(clock != this, "an allocator cannot number its events by itself");
  std::lock_guard<std::mutex> lock(mutex_);
  clock_ = clock;
}

std::vector<MemoryEvent> CachingAllocator::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

void CachingAllocator::clear_events() {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.clear();
  seq_ = 0;
}

uint64_t CachingAllocator::event_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

std::vector<std::string> CachingAllocator::owner_names() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return owners_;
}

void CachingAllocator::note_shape(const Block* block, const std::string& shape) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!log_events_ || !block) return;
  // The alloc event is the last one recorded for this block (no other thread allocates in
  // between on a profiled device), but look back a little to be safe.
  for (size_t k = events_.size(), n = 0; k-- > 0 && n < 8; ++n) {
    MemoryEvent& e = events_[k];
    if (e.kind != MemoryEvent::Kind::alloc || e.alloc_id != block->alloc_id) continue;
    auto [it, fresh] = shape_ids_.emplace(shape, static_cast<uint32_t>(shapes_.size()));
    if (fresh) shapes_.push_back(shape);
    e.shape = it->second;
    return;
  }
}

std::vector<std::string> CachingAllocator::shape_names() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shapes_;
}

// ---------------------------------------------------------------------------

CachingAllocator& allocator_for(Device d) {
  static std::mutex mutex;
  // Intentionally never destroyed: tensors in static storage may outlive main().
  static auto* registry = new std::map<std::string, std::unique_ptr<CachingAllocator>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*registry)[d.str()];
  if (!slot) {
    const DeviceKind& kind = device_kind(d);
    try {
      if (kind.require_available) kind.require_available(d);
      REMAT_CHECK(kind.make_raw_allocator, "device ", d.str(), " has no allocator");
      slot = std::make_unique<CachingAllocator>(d, kind.make_raw_allocator(d));
    } catch (...) {
      registry->erase(d.str());
      throw;
    }
  }
  return *slot;
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes < 0 ? -bytes : bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%s%" PRId64 " B", bytes < 0 ? "-" : "", bytes < 0 ? -bytes : bytes);
  else
    std::snprintf(buf, sizeof buf, "%s%.2f %s", bytes < 0 ? "-" : "", v, units[u]);
  return buf;
}

}  // namespace remat
