// The caching allocator: exact figures after scripted sequences, reuse, meta == cpu,
// leaks reported, out-of-memory errors.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "remat/log.h"
#include "remat/memory.h"
#include "remat/tensor.h"
#include "support/expect_error.h"

using remat::AllocTag;
using remat::Block;
using remat::CachingAllocator;
using remat::Device;
using remat::MemoryCategory;
using remat::Phase;

namespace {

AllocTag tag(MemoryCategory c, const char* owner = "", Phase p = Phase::forward) { return {c, owner, p}; }

}  // namespace

TEST(Allocator, RoundsTo512) {
  EXPECT_EQ(CachingAllocator::round_size(0), 512u);
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
}

TEST(Allocator, ScriptedSequenceGivesExactFigures) {
  CachingAllocator a(Device::cpu(), remat::make_cpu_raw_allocator());
  Block* p = a.allocate(1000, tag(MemoryCategory::parameter, "fc1"));   // 1024
  Block* x = a.allocate(4096, tag(MemoryCategory::activation, "fc1"));  // 4096
  Block* t = a.allocate(100, tag(MemoryCategory::temporary, "loss"));   // 512
  auto s = a.stats();
  EXPECT_EQ(s.allocated, 1024 + 4096 + 512);
  EXPECT_EQ(s.requested, 1000 + 4096 + 100);
  EXPECT_EQ(s.reserved, 1024 + 4096 + 512);
  EXPECT_EQ(s.num_allocs, 3);
  EXPECT_EQ(s.live_blocks, 3);
  EXPECT_EQ(s.by_category[MemoryCategory::parameter], 1024);
  EXPECT_EQ(s.by_category[MemoryCategory::activation], 4096);
  EXPECT_EQ(s.by_category[MemoryCategory::temporary], 512);
  EXPECT_EQ(s.by_category.total(), s.allocated);

  a.free(x);
  Block* g = a.allocate(2000, tag(MemoryCategory::gradient, "fc1", Phase::backward));  // 2048 of the 4096
  s = a.stats();
  EXPECT_EQ(s.allocated, 1024 + 512 + 2048);
  EXPECT_EQ(s.peak_allocated, 1024 + 4096 + 512);
  EXPECT_EQ(s.by_category_at_peak[MemoryCategory::activation], 4096);
  EXPECT_EQ(s.by_category_at_peak[MemoryCategory::gradient], 0);
  EXPECT_EQ(s.peak_by_category[MemoryCategory::gradient], 2048);
  EXPECT_EQ(s.reserved, 1024 + 4096 + 512);  // the cached 4096 block, split: no new segment
  EXPECT_EQ(s.num_cache_hits, 1);
  EXPECT_EQ(s.num_splits, 1);  // whole, it would waste more than a quarter of 2048

  auto owners = a.owner_stats();
  EXPECT_EQ(owners["fc1"].current, 1024 + 2048);
  EXPECT_EQ(owners["fc1"].peak, 1024 + 4096);
  EXPECT_EQ(owners["fc1"].count, 3);
  EXPECT_EQ(owners["loss"].current, 512);

  a.reset_peak();
  s = a.stats();
  EXPECT_EQ(s.peak_allocated, s.allocated);
  EXPECT_EQ(s.peak_by_category[MemoryCategory::activation], 0);

  a.free(p);
  a.free(t);
  a.free(g);
  s = a.stats();
  EXPECT_EQ(s.allocated, 0);
  EXPECT_EQ(s.requested, 0);
  EXPECT_EQ(s.live_blocks, 0);
  EXPECT_EQ(s.by_category.total(), 0);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0);
  EXPECT_EQ(a.stats().num_raw_frees, a.stats().num_raw_allocs);
}

TEST(Allocator, ReusesFreedBlocks) {
  CachingAllocator a(Device::cpu(), remat::make_cpu_raw_allocator());
  Block* b1 = a.allocate(10000);
  void* ptr = b1->ptr;
  a.free(b1);
  Block* b2 = a.allocate(9000);  // rounds to 9216 <= 10240: served from the cache
  EXPECT_EQ(b2->ptr, ptr);
  auto s = a.stats();
  EXPECT_EQ(s.num_cache_hits, 1);
  EXPECT_EQ(s.num_raw_allocs, 1);
  EXPECT_EQ(s.allocated, 9216);  // counted at the request's rounded size...
  EXPECT_EQ(s.reserved, 10240);  // ...while the block's raw size stays reserved
  a.free(b2);
}

namespace {

// Meta's fake addresses, but every raw allocation bounds-checked on its own (as cuda-emu's
// guard pages and AddressSanitizer on cpu): counts what is live.
class GuardedRaw final : public remat::RawAllocator {
 public:
  void* allocate(size_t bytes) override {
    ++live;
    return inner_->allocate(bytes);
  }
  void deallocate(void* p, size_t bytes) override {
    --live;
    inner_->deallocate(p, bytes);
  }
  bool has_data() const override { return false; }
  int64_t capacity() const override { return inner_->capacity(); }
  bool guards_each_allocation() const override { return true; }
  int live = 0;

 private:
  std::unique_ptr<remat::RawAllocator> inner_ = remat::make_meta_raw_allocator();
};

char* at(const Block* b) { return static_cast<char*>(b->ptr); }

}  // namespace

TEST(Allocator, SplitsALargeCachedBlockAndMergesThePiecesBack) {
  CachingAllocator a(Device::meta(), remat::make_meta_raw_allocator());
  Block* big = a.allocate(10240);
  char* base = at(big);
  a.free(big);
  Block* x = a.allocate(2048);  // 8192 left over: split, not a second segment
  Block* y = a.allocate(8192);  // the rest of the segment
  EXPECT_EQ(at(x), base);
  EXPECT_EQ(at(y), base + 2048);
  auto s = a.stats();
  EXPECT_EQ(s.num_raw_allocs, 1);
  EXPECT_EQ(s.num_splits, 1);
  EXPECT_EQ(s.num_cache_hits, 2);
  EXPECT_EQ(s.reserved, 10240);
  EXPECT_EQ(s.allocated, 10240);
  a.empty_cache();  // nothing is wholly free: nothing goes back
  EXPECT_EQ(a.stats().reserved, 10240);
  a.free(x);
  Block* small = a.allocate(1024);  // the 2048 piece, split again
  EXPECT_EQ(at(small), base);
  a.free(y);      // merges with the 1024 free after `small`
  a.free(small);  // ... and the whole segment is one block again
  Block* whole = a.allocate(10000);
  EXPECT_EQ(at(whole), base);
  EXPECT_EQ(a.stats().num_raw_allocs, 1);
  a.free(whole);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0);
  EXPECT_EQ(a.stats().num_raw_frees, 1);
}

TEST(Allocator, AWholeBlockServesARequestThatWastesAtMostAQuarter) {
  CachingAllocator a(Device::meta(), remat::make_meta_raw_allocator());
  Block* b = a.allocate(10240);
  a.free(b);
  Block* c = a.allocate(8192);  // 2048 left over, a quarter of the request: no split
  EXPECT_EQ(a.stats().num_splits, 0);
  EXPECT_EQ(a.stats().allocated, 8192);  // counted at the request's size
  a.free(c);
}

TEST(Allocator, GuardedRawMemoryServesEachPieceAndAccountsAsTheSegment) {
  auto guarded = std::make_unique<GuardedRaw>();
  GuardedRaw& raw = *guarded;
  CachingAllocator g(Device::meta(), std::move(guarded));
  CachingAllocator m(Device::meta(), remat::make_meta_raw_allocator());
  Block* gb = g.allocate(10240);
  Block* mb = m.allocate(10240);
  g.free(gb);
  m.free(mb);
  EXPECT_EQ(raw.live, 1);
  Block* gx = g.allocate(2048);
  Block* gy = g.allocate(4096);
  Block* mx = m.allocate(2048);
  Block* my = m.allocate(4096);
  EXPECT_EQ(raw.live, 3);  // the segment, and one raw allocation per piece in use
  EXPECT_NE(gx->ptr, gy->ptr);
  const auto sg = g.stats(), sm = m.stats();
  EXPECT_EQ(sg.reserved, sm.reserved);
  EXPECT_EQ(sg.reserved, 10240);
  EXPECT_EQ(sg.num_splits, sm.num_splits);
  EXPECT_EQ(sg.num_raw_allocs, sm.num_raw_allocs);
  g.free(gx);
  g.free(gy);
  m.free(mx);
  m.free(my);
  EXPECT_EQ(raw.live, 1);         // the pieces' raw memory went back; the segment stays cached
  Block* gw = g.allocate(10240);  // one block again: the segment's own memory
  EXPECT_EQ(raw.live, 1);
  g.free(gw);
}

TEST(Allocator, MetaAccountingEqualsCpuAccounting) {
  CachingAllocator cpu(Device::cpu(), remat::make_cpu_raw_allocator());
  CachingAllocator meta(Device::meta(), remat::make_meta_raw_allocator());
  cpu.set_event_logging(true);
  meta.set_event_logging(true);
  std::mt19937 rng(5);
  std::vector<Block*> live_cpu, live_meta;
  std::vector<int> marks;
  for (int step = 0; step < 2000; ++step) {
    if (!live_cpu.empty() && rng() % 3 == 0) {
      size_t i = rng() % live_cpu.size();
      cpu.free(live_cpu[i]);
      meta.free(live_meta[i]);
      live_cpu.erase(live_cpu.begin() + static_cast<long>(i));
      live_meta.erase(live_meta.begin() + static_cast<long>(i));
      marks.erase(marks.begin() + static_cast<long>(i));
    } else {
      size_t bytes = rng() % 200000;
      auto c = static_cast<MemoryCategory>(rng() % remat::kNumMemoryCategories);
      std::string owner = "layer" + std::to_string(rng() % 7);
      live_cpu.push_back(cpu.allocate(bytes, tag(c, owner.c_str())));
      live_meta.push_back(meta.allocate(bytes, tag(c, owner.c_str())));
      // Its bytes hold its step's mark: a piece that overlapped another would lose them.
      std::memset(live_cpu.back()->ptr, step & 0xff, bytes);
      marks.push_back(step & 0xff);
    }
  }
  for (size_t i = 0; i < live_cpu.size(); ++i) {
    const auto* p = static_cast<const unsigned char*>(live_cpu[i]->ptr);
    for (size_t k = 0; k < live_cpu[i]->requested; ++k) ASSERT_EQ(p[k], marks[i]) << "block " << i << " byte " << k;
  }
  EXPECT_GT(cpu.stats().num_splits, 0);
  auto sc = cpu.stats(), sm = meta.stats();
  EXPECT_EQ(sc.allocated, sm.allocated);
  EXPECT_EQ(sc.peak_allocated, sm.peak_allocated);
  EXPECT_EQ(sc.reserved, sm.reserved);
  EXPECT_EQ(sc.peak_reserved, sm.peak_reserved);
  EXPECT_EQ(sc.num_cache_hits, sm.num_cache_hits);
  EXPECT_EQ(sc.num_splits, sm.num_splits);
  EXPECT_EQ(sc.by_category.bytes, sm.by_category.bytes);
  EXPECT_EQ(sc.by_category_at_peak.bytes, sm.by_category_at_peak.bytes);
  EXPECT_EQ(sc.peak_by_category.bytes, sm.peak_by_category.bytes);
  auto ec = cpu.events(), em = meta.events();
  ASSERT_EQ(ec.size(), em.size());
  for (size_t i = 0; i < ec.size(); ++i) {
    ASSERT_EQ(ec[i].kind, em[i].kind) << i;
    ASSERT_EQ(ec[i].bytes, em[i].bytes) << i;
    ASSERT_EQ(ec[i].allocated_after, em[i].allocated_after) << i;
  }
  EXPECT_GT(sc.peak_allocated, 0);
  for (Block* b : live_cpu) cpu.free(b);
  for (Block* b : live_meta) meta.free(b);
}

TEST(Allocator, EventLogRecordsEveryAllocationAndFree) {
  CachingAllocator a(Device::cpu(), remat::make_cpu_raw_allocator());
  a.set_event_logging(true);
  Block* b = a.allocate(700, tag(MemoryCategory::workspace, "conv1", Phase::backward));
  a.free(b);
  Block* c = a.allocate(600, tag(MemoryCategory::activation, "relu", Phase::recompute));  // reuses b
  a.free(c);
  auto ev = a.events();
  ASSERT_EQ(ev.size(), 5u);  // raw_alloc, alloc, free, alloc (cache hit), free
  using K = remat::MemoryEvent::Kind;
  EXPECT_EQ(ev[0].kind, K::raw_alloc);
  EXPECT_EQ(ev[1].kind, K::alloc);
  EXPECT_EQ(ev[1].bytes, 1024);
  EXPECT_EQ(ev[1].category, MemoryCategory::workspace);
  EXPECT_EQ(ev[1].phase, Phase::backward);
  EXPECT_EQ(a.owner_names()[ev[1].owner], "conv1");
  EXPECT_EQ(ev[1].allocated_after, 1024);
  EXPECT_EQ(ev[2].kind, K::free);
  EXPECT_EQ(ev[2].allocated_after, 0);
  EXPECT_EQ(ev[3].kind, K::alloc);
  EXPECT_EQ(ev[3].phase, Phase::recompute);
  EXPECT_EQ(a.owner_names()[ev[3].owner], "relu");
  for (size_t i = 1; i < ev.size(); ++i) EXPECT_EQ(ev[i].seq, ev[i - 1].seq + 1);
}

TEST(Allocator, TagScopesNestAndTagTensors) {
  auto& a = remat::allocator_for(Device::cpu());
  const auto before = a.stats();
  {
    remat::TagScope outer(MemoryCategory::activation, "block1", Phase::forward);
    remat::Tensor x = remat::Tensor::empty({256});
    {
      remat::TagScope inner(MemoryCategory::workspace, "block1.conv", Phase::recompute);
      remat::Tensor w = remat::Tensor::empty({128});
      EXPECT_EQ(w.storage()->block().category, MemoryCategory::workspace);
      EXPECT_EQ(w.storage()->block().phase, Phase::recompute);
      auto s = a.stats();
      EXPECT_EQ(s.by_category[MemoryCategory::workspace] - before.by_category[MemoryCategory::workspace], 512);
    }
    EXPECT_EQ(x.storage()->block().category, MemoryCategory::activation);
    EXPECT_EQ(remat::current_tag().owner, "block1");
  }
  EXPECT_EQ(remat::current_tag().category, MemoryCategory::temporary);
  EXPECT_EQ(a.stats().allocated, before.allocated);
}

TEST(Allocator, LeakIsReportedAtTeardown) {
  remat::LogCapture capture;
  Block* leaked = nullptr;
  {
    CachingAllocator a(Device::meta(), remat::make_meta_raw_allocator());
    leaked = a.allocate(100, tag(MemoryCategory::activation, "forgotten"));
  }
  (void)leaked;
  ASSERT_GE(capture.count_at_least(spdlog::level::err), 1u);
  bool named = false;
  for (const auto& r : capture.records()) named = named || r.message.find("forgotten") != std::string::npos;
  EXPECT_TRUE(named);
}

TEST(Allocator, DoubleFreeIsAnError) {
  CachingAllocator a(Device::cpu(), remat::make_cpu_raw_allocator());
  Block* b = a.allocate(10);
  a.free(b);
  EXPECT_REMAT_ERROR(a.free(b), "double free");
}

TEST(Allocator, LimitGivesOutOfMemoryErrorAndEmptiesCacheFirst) {
  CachingAllocator a(Device::meta(), remat::make_meta_raw_allocator());
  a.set_limit(8192);
  Block* b1 = a.allocate(4096);
  Block* b2 = a.allocate(2048);
  a.free(b2);  // 2048 cached
  // 4096 more does not fit beside 4096 live + 2048 cached, but does once the cache is emptied.
  Block* b3 = a.allocate(4096);
  EXPECT_EQ(a.stats().reserved, 8192);
  EXPECT_REMAT_ERROR(a.allocate(1, tag(MemoryCategory::activation, "attn", Phase::forward)),
                     "out of memory on meta: tried to allocate 1 B (1 bytes; category activation, owner \"attn\"");
  a.free(b1);
  a.free(b3);
}

TEST(Allocator, AllocationFarBeyondMemoryIsAnError) {
  EXPECT_REMAT_ERROR(remat::Tensor::empty({int64_t{1} << 40, 1024}), "out of memory on cpu");
  EXPECT_EQ(remat::allocator_for(Device::cpu()).stats().live_blocks, 0);
}

TEST(Allocator, MetaHoldsWhatNoMachineCould) {
  // 1 TiB on meta: accounted, never touched.
  remat::Tensor t = remat::Tensor::empty({int64_t{1} << 38}, Device::meta());
  EXPECT_EQ(remat::allocator_for(Device::meta()).stats().allocated, int64_t{1} << 40);
  EXPECT_REMAT_ERROR(t.f32(), "has no data");
}

TEST(Allocator, FormatBytes) {
  EXPECT_EQ(remat::format_bytes(0), "0 B");
  EXPECT_EQ(remat::format_bytes(1023), "1023 B");
  EXPECT_EQ(remat::format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(remat::format_bytes(int64_t{3} << 30), "3.00 GiB");
}
