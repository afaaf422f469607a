// Memory: one caching allocator per device, with exact accounting.
//
// Every allocation carries a tag: a category (what the bytes are for), an owner (the layer
// or component) and a phase (when it was made). The allocator keeps, in the spirit of
// torch.cuda.memory_stats, current and peak allocated and reserved bytes, and the same
// split by category and by owner, plus an optional event log the memory profiler reads.
//
// "Allocated" counts each live allocation at its rounded size (a multiple of kRounding),
// independently of which cached block served it, so the figure depends only on the
// sequence of requests: the meta device, which replays the same sequence without data,
// reports the same allocated figures to the byte. "Reserved" counts raw memory held,
// including cached free blocks.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "remat/device.h"

namespace remat {

enum class MemoryCategory : uint8_t {
  parameter,
  gradient,
  optimizer_state,
  activation,
  workspace,
  temporary,
  input,
};
constexpr int kNumMemoryCategories = 7;
const char* category_name(MemoryCategory c);
MemoryCategory parse_category(const std::string& s);

enum class Phase : uint8_t { setup, forward, recompute, backward, optimizer };
constexpr int kNumPhases = 5;
const char* phase_name(Phase p);

// Who asked for the bytes and why.
struct AllocTag {
  MemoryCategory category = MemoryCategory::temporary;
  std::string owner;  // a layer name, "optimizer", "data", ...; may be empty
  Phase phase = Phase::setup;
};

// Sets the tag of allocations made on this thread while it lives (scopes nest).
class TagScope {
 public:
  TagScope(MemoryCategory category, std::string owner, Phase phase);
  explicit TagScope(AllocTag tag);
  ~TagScope();
  TagScope(const TagScope&) = delete;
  TagScope& operator=(const TagScope&) = delete;

 private:
  AllocTag saved_;
};
const AllocTag& current_tag();

struct CategoryCounts {
  std::array<int64_t, kNumMemoryCategories> bytes{};
  int64_t& operator[](MemoryCategory c) { return bytes[static_cast<size_t>(c)]; }
  int64_t operator[](MemoryCategory c) const { return bytes[static_cast<size_t>(c)]; }
  int64_t total() const;
};

struct MemoryStats {
  int64_t allocated = 0;  // bytes in live allocations (rounded sizes)
  int64_t peak_allocated = 0;
  int64_t requested = 0;  // bytes callers asked for (unrounded)
  int64_t reserved = 0;   // raw bytes held (live + cached)
  int64_t peak_reserved = 0;
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t num_raw_allocs = 0;  // calls into the raw allocator (cudaMalloc, aligned_alloc)
  int64_t num_raw_frees = 0;
  int64_t num_cache_hits = 0;  // allocations served from a cached block
  int64_t num_splits = 0;      // cached blocks split to serve a smaller request
  int64_t live_blocks = 0;
  CategoryCounts by_category;          // current allocated, per category
  CategoryCounts peak_by_category;     // each category's own peak
  CategoryCounts by_category_at_peak;  // the split of peak_allocated when it was reached
};

struct OwnerStats {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t total = 0;  // bytes allocated over time
  int64_t count = 0;  // allocations over time
};

struct MemoryEvent {
  enum class Kind : uint8_t { alloc, free, raw_alloc, raw_free };
  uint64_t seq = 0;
  uint64_t alloc_id = 0;  // pairs an alloc with its free (unique per allocation)
  Kind kind = Kind::alloc;
  int64_t bytes = 0;  // rounded size for alloc/free; raw size for raw_*
  MemoryCategory category = MemoryCategory::temporary;
  Phase phase = Phase::setup;
  uint32_t owner = 0;           // index into CachingAllocator::owner_names()
  uint32_t shape = 0;           // alloc: index into CachingAllocator::shape_names() (0: not a tensor's)
  int64_t allocated_after = 0;  // total allocated after the event
  int64_t reserved_after = 0;
};

// Source of raw memory for one device. allocate returns nullptr when out of memory.
class RawAllocator {
 public:
  virtual ~RawAllocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual bool has_data() const { return true; }  // false for meta
  virtual int64_t capacity() const = 0;           // bytes the device can hold
  // True where every raw allocation is bounds-checked on its own (cuda-emu's guard pages,
  // AddressSanitizer on cpu): the caching allocator then serves each piece of a split
  // segment from a raw allocation of its own, so an access past a block's end is still
  // caught, while its accounting stays that of the pieces carved from the segment.
  virtual bool guards_each_allocation() const { return false; }
};
std::unique_ptr<RawAllocator> make_cpu_raw_allocator();
std::unique_ptr<RawAllocator> make_meta_raw_allocator();
// Raw memory carved from large chunks that `get` takes from the system (each at least
// `chunk` bytes; null: out of memory) and `put` returns when the allocator goes: a handful
// of system calls per run for memory that is slow to obtain (pinned host memory, whose
// cudaMallocHost pins every page). Host memory (capacity: the machine's).
std::unique_ptr<RawAllocator> make_chunked_raw_allocator(std::function<void*(size_t)> get,
                                                         std::function<void(void*)> put, size_t chunk);

class CachingAllocator;

// One allocation, or a cached free range. A block spans part or all of a segment (one raw
// allocation); returned to its allocator's cache when released, where it merges with the
// free blocks beside it in its segment.
struct Block {
  void* ptr = nullptr;   // its bytes
  size_t size = 0;       // bytes of its segment it spans
  size_t rounded = 0;    // rounded size of the request it currently serves
  size_t requested = 0;  // what the caller asked for
  MemoryCategory category = MemoryCategory::temporary;
  Phase phase = Phase::setup;
  uint32_t owner = 0;
  uint64_t alloc_id = 0;
  bool in_use = false;
  // Its segment: the raw allocation, this block's offset in it, and the blocks before and
  // after it there (null at the segment's ends: both null, the block is the whole segment).
  void* segment = nullptr;
  size_t offset = 0;
  Block* prev = nullptr;
  Block* next = nullptr;
  void* own_raw = nullptr;                         // a piece in use on a guarded raw allocator: its own raw memory
  std::multimap<size_t, Block*>::iterator cached;  // its entry among the free blocks
};

class CachingAllocator {
 public:
  static constexpr size_t kRounding = 512;
  // A request takes the smallest cached block that holds it: whole if what is left over is
  // at most a quarter of the request, else split, the rest staying cached (docs/memory.md,
  // "Reserved memory").
  static constexpr size_t kMaxSlackDivisor = 4;

  CachingAllocator(Device device, std::unique_ptr<RawAllocator> raw);
  ~CachingAllocator();  // logs an error for every block still in use (a leak)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  Device device() const { return device_; }
  bool has_data() const { return raw_->has_data(); }

  // Allocates `bytes` (0 allowed) with the given tag, or the thread's current tag.
  Block* allocate(size_t bytes, const AllocTag& tag);
  Block* allocate(size_t bytes) { return allocate(bytes, current_tag()); }
  void free(Block* block);

  static size_t round_size(size_t bytes);

  // Returns every wholly free segment to the raw allocator (a free piece of a segment in
  // use stays cached).
  void empty_cache();
  // Caps reserved bytes; allocations beyond it fail as out-of-memory. 0 = no cap beyond
  // the device's own limit.
  void set_limit(int64_t bytes);
  int64_t limit() const;

  MemoryStats stats() const;
  void reset_peak();  // peaks := current values
  std::map<std::string, OwnerStats> owner_stats() const;

  void set_event_logging(bool on);
  // Numbers this allocator's events by another's instead of its own: each event's seq is
  // `clock`'s event_count() when it happens (the seq of the clock's next event), so events
  // of the two allocators interleave in one order (the pinned host pool's on the device's
  // timeline). Null: its own count. `clock` must outlive the logging.
  void set_event_clock(const CachingAllocator* clock);
  std::vector<MemoryEvent> events() const;
  uint64_t event_count() const;  // events recorded so far (the next event's index)
  void clear_events();
  std::vector<std::string> owner_names() const;
  // With event logging on: names the shape of the tensor that `block` was just allocated for
  // (Tensor::empty calls it), recorded in its alloc event. Cheap to skip: event_logging().
  bool event_logging() const { return log_events_.load(std::memory_order_relaxed); }
  void note_shape(const Block* block, const std::string& shape);
  std::vector<std::string> shape_names() const;  // [0] = ""

 private:
  uint32_t intern_owner(const std::string& name);
  void record(MemoryEvent::Kind kind, int64_t bytes, const Block& b);
  void release_cached_locked();
  void cache_locked(Block* block);
  void uncache_locked(Block* block);
  Block* split_locked(Block* block, size_t bytes);
  void return_to_cache_locked(Block* block);
  Block* new_block_locked();
  void retire_block_locked(Block* block);
  [[noreturn]] void throw_oom(size_t bytes, const AllocTag& tag);

  Device device_;
  std::unique_ptr<RawAllocator> raw_;
  mutable std::mutex mutex_;
  std::multimap<size_t, Block*> free_blocks_;                  // by size; equal sizes in the order cached
  std::unordered_map<Block*, std::unique_ptr<Block>> blocks_;  // every block: live, cached or spare
  std::vector<Block*> spare_blocks_;                           // of blocks_, neither live nor cached
  MemoryStats stats_;
  int64_t limit_ = 0;
  std::vector<std::string> owners_{""};
  std::unordered_map<std::string, uint32_t> owner_ids_{{"", 0}};
  std::vector<OwnerStats> owner_stats_{OwnerStats{}};
  std::atomic<bool> log_events_{false};
  std::vector<std::string> shapes_{""};
  std::unordered_map<std::string, uint32_t> shape_ids_{{"", 0}};
  uint64_t seq_ = 0;
  const CachingAllocator* clock_ = nullptr;
  uint64_t next_alloc_id_ = 1;
  std::vector<MemoryEvent> events_;
};

// The process-wide allocator of a device (created on first use).
CachingAllocator& allocator_for(Device d);

// Formats a byte count: "1.50 MiB".
std::string format_bytes(int64_t bytes);

}  // namespace remat
