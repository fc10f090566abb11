#include "pqloader/exec/ordered_pipeline.h"

#include <gtest/gtest.h>

#include <atomic>

namespace pqloader {

namespace {

using Pipeline = OrderedPipeline<int64_t, std::vector<int64_t>>;

// Batch b reads units [b, b + 2) of `units` units; its value is the unit values.
Pipeline::Work MakeWork(int64_t batches, std::atomic<int64_t>* units_run, int64_t fail_unit = -1) {
  Pipeline::Work w;
  w.num_batches = batches;
  w.batch_units = [](int64_t b) { return std::make_pair(b, b + 2); };
  w.run_unit = [units_run, fail_unit](int64_t u, int64_t* bytes)
      -> arrow::Result<std::shared_ptr<const int64_t>> {
    ++*units_run;
    if (u == fail_unit) return arrow::Status::IOError("unit ", u, " failed");
    *bytes = 100;
    return std::make_shared<const int64_t>(u * 10);
  };
  w.run_batch = [](int64_t b, const std::vector<std::shared_ptr<const int64_t>>& units,
                   int64_t* bytes) -> arrow::Result<std::shared_ptr<std::vector<int64_t>>> {
    auto out = std::make_shared<std::vector<int64_t>>();
    for (const auto& u : units) out->push_back(*u);
    *bytes = 10;
    return out;
  };
  return w;
}

}  // namespace

TEST(OrderedPipeline, DeliversInOrderWhateverTheThreadsAndDelays) {
  for (int threads : {1, 2, 4, 8}) {
    std::atomic<int64_t> runs{0};
    PipelineOptions o;
    o.num_threads = threads;
    o.debug_max_delay_us = 300;
    Pipeline p(MakeWork(50, &runs), o, 0);
    for (int64_t b = 0; b < 50; ++b) {
      auto r = p.Next();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_NE(*r, nullptr);
      EXPECT_EQ(**r, (std::vector<int64_t>{b * 10, b * 10 + 10}));
    }
    auto end = p.Next();
    ASSERT_TRUE(end.ok());
    EXPECT_EQ(*end, nullptr);
    EXPECT_EQ(runs.load(), 51);  // every unit exactly once
  }
}

TEST(OrderedPipeline, StartsMidwayWithoutReadingEarlierUnits) {
  std::atomic<int64_t> runs{0};
  PipelineOptions o;
  o.num_threads = 3;
  Pipeline p(MakeWork(20, &runs), o, 15);
  auto r = p.Next();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(**r, (std::vector<int64_t>{150, 160}));
  while (true) {
    auto n = p.Next();
    ASSERT_TRUE(n.ok());
    if (*n == nullptr) break;
  }
  EXPECT_EQ(runs.load(), 6);  // units 15..20
}

TEST(OrderedPipeline, AFailedUnitFailsTheFirstBatchThatReadsItAndStops) {
  std::atomic<int64_t> runs{0};
  PipelineOptions o;
  o.num_threads = 4;
  o.debug_max_delay_us = 200;
  Pipeline p(MakeWork(30, &runs, /*fail_unit=*/7), o, 0);
  for (int64_t b = 0; b < 6; ++b) {
    auto r = p.Next();
    ASSERT_TRUE(r.ok()) << "batch " << b << ": " << r.status().ToString();
  }
  auto failed = p.Next();  // batch 6 reads units 6 and 7
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("unit 7 failed"), std::string::npos);
  EXPECT_FALSE(p.Next().ok());  // sticky, no hang
}

TEST(OrderedPipeline, PrefetchIsBounded) {
  std::atomic<int64_t> runs{0};
  PipelineOptions o;
  o.num_threads = 4;
  o.max_prefetch_batches = 2;
  o.max_inflight_bytes = 1;  // only what the consumer needs now
  Pipeline p(MakeWork(100, &runs), o, 0);
  ASSERT_TRUE(p.Next().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // Units of batch 0 and 1 (the prefetch horizon) at most, plus what batch 1 needs now.
  EXPECT_LE(runs.load(), 4);
  EXPECT_LE(p.counters().peak_inflight_bytes, 4 * 100 + 2 * 10);
}

TEST(OrderedPipeline, ExceptionsInTasksBecomeErrors) {
  Pipeline::Work w;
  w.num_batches = 1;
  w.batch_units = [](int64_t) { return std::make_pair(int64_t{0}, int64_t{1}); };
  w.run_unit = [](int64_t, int64_t*) -> arrow::Result<std::shared_ptr<const int64_t>> {
    throw std::runtime_error("boom");
  };
  w.run_batch = [](int64_t, const std::vector<std::shared_ptr<const int64_t>>&, int64_t*)
      -> arrow::Result<std::shared_ptr<std::vector<int64_t>>> { return nullptr; };
  Pipeline p(std::move(w), PipelineOptions{}, 0);
  auto r = p.Next();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("boom"), std::string::npos);
}

}  // namespace pqloader
