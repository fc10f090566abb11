#include "pqloader/exec/ordered_pipeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

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
    o.num_workers = threads;
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
  o.num_workers = 3;
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
  o.num_workers = 4;
  o.debug_max_delay_us = 200;
  Pipeline p(MakeWork(30, &runs, /*fail_unit=*/7), o, 0);
  for (int64_t b = 0; b < 6; ++b) {
    auto r = p.Next();
    ASSERT_TRUE(r.ok()) << "batch " << b << ": " << r.status().ToString();
  }
  auto failed = p.Next();  // batch 6 reads units 6 and 7
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("unit 7 failed"), std::string::npos);
  for (int i = 0; i < 2; ++i) {  // sticky: the same error again, no hang
    auto again = p.Next();
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status().ToString(), failed.status().ToString());
  }
}

TEST(OrderedPipeline, NoUnitIsStartedAfterOneFailed) {
  // One worker, no budget beyond the floor (units 0 and 1 of batch 0): unit 0 fails, the
  // batch fails at once, and unit 1, which could only feed failed batches, never runs.
  std::atomic<int64_t> runs{0};
  PipelineOptions o;
  o.num_workers = 1;
  o.max_inflight_bytes = 1;
  Pipeline p(MakeWork(10, &runs, /*fail_unit=*/0), o, 0);
  auto r = p.Next();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unit 0 failed"), std::string::npos);
  p.Shutdown();
  EXPECT_EQ(runs.load(), 1);
}

TEST(OrderedPipeline, ABatchFailsWithItsFirstFailedUnitWhicheverFailsFirst) {
  // Batch 0 reads units 0..3: unit 0 fails late, unit 3 at once. The batch failed with
  // whichever failed first in time (unit 3 here), so the error depended on the threads.
  for (int run = 0; run < 10; ++run) {
    Pipeline::Work w;
    w.num_batches = 1;
    w.batch_units = [](int64_t) { return std::make_pair(int64_t{0}, int64_t{4}); };
    w.run_unit = [](int64_t u, int64_t* bytes) -> arrow::Result<std::shared_ptr<const int64_t>> {
      if (u == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return arrow::Status::Invalid("unit 0 failed");
      }
      if (u == 3) return arrow::Status::Invalid("unit 3 failed");
      *bytes = 1;
      return std::make_shared<const int64_t>(u);
    };
    w.run_batch = [](int64_t, const std::vector<std::shared_ptr<const int64_t>>&,
                     int64_t* bytes) -> arrow::Result<std::shared_ptr<std::vector<int64_t>>> {
      *bytes = 1;
      return std::make_shared<std::vector<int64_t>>();
    };
    PipelineOptions o;
    o.num_workers = 4;
    o.max_inflight_bytes = int64_t{1} << 20;
    Pipeline p(std::move(w), o, 0);
    auto r = p.Next();
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("unit 0 failed"), std::string::npos) << r.status().ToString();
  }
}

// Poll `pred` until it holds or `seconds` pass; return whether it held. (A wait for
// progress with a deadline, not a sleep followed by a check.)
template <typename Pred>
bool Eventually(Pred pred, double seconds = 10) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

// Batch b reads unit b only; units are 100 bytes (and say so), batches 10.
Pipeline::Work OneUnitPerBatch(int64_t batches, std::atomic<int64_t>* units_run) {
  Pipeline::Work w = MakeWork(batches, units_run);
  w.batch_units = [](int64_t b) { return std::make_pair(b, b + 1); };
  w.unit_bytes = [](int64_t) { return int64_t{100}; };
  return w;
}

TEST(OrderedPipeline, ReadinessChecksCostAFewLookupsPerUnitNotPerBatchUnit) {
  // Every batch reads one window of 20,000 units (a shuffle window of one-row row
  // groups). The checks looked up each of a batch's units in every worker's wait and
  // after every claim: ~10^9 lookups here, 51 s to a loader's first batch.
  static constexpr int64_t kUnits = 20000;
  Pipeline::Work w;
  w.num_batches = 4;
  w.batch_units = [](int64_t) { return std::make_pair(int64_t{0}, kUnits); };
  w.run_unit = [](int64_t u, int64_t* bytes) -> arrow::Result<std::shared_ptr<const int64_t>> {
    *bytes = 1;
    return std::make_shared<const int64_t>(u);
  };
  w.run_batch = [](int64_t, const std::vector<std::shared_ptr<const int64_t>>& units,
                   int64_t* bytes) -> arrow::Result<std::shared_ptr<std::vector<int64_t>>> {
    *bytes = 1;
    int64_t sum = 0;
    for (const auto& u : units) sum += *u;
    return std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{
        static_cast<int64_t>(units.size()), sum});
  };
  PipelineOptions o;
  o.num_workers = 2;
  o.max_inflight_bytes = int64_t{1} << 30;
  Pipeline p(std::move(w), o, 0);
  for (int b = 0; b < 4; ++b) {
    auto batch = p.Next();
    ASSERT_TRUE(batch.ok()) << batch.status().ToString();
    ASSERT_NE(*batch, nullptr);
    EXPECT_EQ(**batch, (std::vector<int64_t>{kUnits, kUnits * (kUnits - 1) / 2}));
  }
  EXPECT_EQ(*p.Next(), nullptr);
  EXPECT_LT(p.counters().units_checked, 20 * kUnits);
}

TEST(OrderedPipeline, LooksAheadByBytesNotByBatches) {
  std::atomic<int64_t> runs{0};
  PipelineOptions o;
  o.num_workers = 3;
  o.max_prefetch_batches = 1;
  o.max_inflight_bytes = 1000;
  Pipeline p(OneUnitPerBatch(100, &runs), o, 0);
  ASSERT_TRUE(p.Next().ok());  // the consumer now holds batch 0 and asks for nothing
  // Counted in batches (one ahead), two or three units would be decoded; by bytes, as
  // many as fit in 1000: batch 1 (10 bytes) plus 9 units.
  EXPECT_TRUE(Eventually([&] { return runs.load() >= 10; })) << runs.load();
  const auto c = p.counters();
  EXPECT_LE(c.inflight_bytes, 1000);
  EXPECT_LE(c.peak_inflight_bytes, 1000 + 100 + 10);  // the floor: one unit, one batch
  EXPECT_LE(runs.load(), 11);
}

TEST(OrderedPipeline, EstimatesAreScaledByTheLargestActualToEstimateRatio) {
  // Units estimated at 1 byte turn out to be 100: after the first one, the estimates are
  // scaled by 100, so look-ahead stops at the budget instead of overshooting it. One
  // worker, so that the end state does not depend on timing: the consumer holds batch 0's
  // successor (max_prefetch_batches 1) and units 2..10 fill 10 + 9 x 100 bytes of 1000.
  std::atomic<int64_t> runs{0};
  Pipeline::Work w = OneUnitPerBatch(100, &runs);
  w.unit_bytes = [](int64_t) { return int64_t{1}; };
  PipelineOptions o;
  o.num_workers = 1;
  o.max_prefetch_batches = 1;
  o.max_inflight_bytes = 1000;
  Pipeline p(std::move(w), o, 0);
  ASSERT_TRUE(p.Next().ok());
  ASSERT_TRUE(Eventually([&] { return runs.load() >= 11; })) << runs.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // an overshoot would come now
  EXPECT_EQ(runs.load(), 11);
  EXPECT_LE(p.counters().peak_inflight_bytes, 1000);
}

TEST(OrderedPipeline, ConsumedBatchesGiveTheirBytesBack) {
  std::atomic<int64_t> runs{0};
  PipelineOptions o;
  o.num_workers = 2;
  o.max_inflight_bytes = 350;
  Pipeline p(OneUnitPerBatch(200, &runs), o, 0);
  for (int64_t b = 0; b < 200; ++b) {
    auto r = p.Next();
    ASSERT_TRUE(r.ok());
    ASSERT_NE(*r, nullptr);
    EXPECT_EQ(**r, (std::vector<int64_t>{b * 10}));
  }
  EXPECT_EQ(*p.Next(), nullptr);
  EXPECT_EQ(p.counters().inflight_bytes, 0);  // a leak would show, and stall the look-ahead
  EXPECT_LE(p.counters().peak_inflight_bytes, 350 + 100 + 10);
  EXPECT_EQ(runs.load(), 200);
}

TEST(OrderedPipeline, ABudgetSmallerThanAUnitStillReadsTheUnitsTheConsumerNeeds) {
  // The floor moves with the consumer: each batch's unit is claimed when that batch is
  // next, whatever the budget (here less than one unit).
  std::atomic<int64_t> runs{0};
  PipelineOptions o;
  o.num_workers = 2;
  o.max_inflight_bytes = 50;
  Pipeline p(OneUnitPerBatch(20, &runs), o, 0);
  for (int64_t b = 0; b < 20; ++b) {
    bool timed_out = false;
    auto r = p.Next(std::chrono::seconds(10), &timed_out);
    ASSERT_FALSE(timed_out) << "batch " << b << " never came";
    ASSERT_TRUE(r.ok());
    ASSERT_NE(*r, nullptr);
    EXPECT_EQ(**r, (std::vector<int64_t>{b * 10}));
  }
  EXPECT_EQ(runs.load(), 20);
}

TEST(OrderedPipeline, AssemblesAtMostMaxPrefetchBatchesAhead) {
  std::atomic<int64_t> runs{0};
  PipelineOptions o;
  o.num_workers = 2;
  o.max_prefetch_batches = 2;
  Pipeline p(OneUnitPerBatch(10, &runs), o, 0);
  // Every unit fits the budget, so once all are decoded only the prefetch bound holds
  // batches back.
  ASSERT_TRUE(Eventually([&] { return p.all_units_done() && p.counters().batches_done >= 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a third would come now
  EXPECT_EQ(p.counters().batches_done, 2);
  ASSERT_TRUE(p.Next().ok());
  ASSERT_TRUE(Eventually([&] { return p.counters().batches_done >= 3; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(p.counters().batches_done, 3);
}

TEST(OrderedPipeline, BatchesThatSayWhatTheyAllocateAreAssembledAheadWhileTheyFit) {
  // Units of 100 bytes, batches that hold 200 and say so (Work::batch_bytes), a budget of
  // 1000, one batch of prefetch, one worker (so the end state does not depend on
  // timing). Without the consumer: batch 0 (the prefetch), then a unit and its batch
  // while unit + batch fit: batches 0-3 (800 bytes); unit 4 (900) leaves no room for
  // its batch, unit 5 fills the budget. Counted in batches, only batch 0 would be made.
  std::atomic<int64_t> runs{0};
  Pipeline::Work w = OneUnitPerBatch(20, &runs);
  w.run_batch = [](int64_t b, const std::vector<std::shared_ptr<const int64_t>>& units,
                   int64_t* bytes) -> arrow::Result<std::shared_ptr<std::vector<int64_t>>> {
    *bytes = 200;
    return std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{*units[0]});
  };
  w.batch_bytes = [](int64_t) { return int64_t{200}; };
  PipelineOptions o;
  o.num_workers = 1;
  o.max_prefetch_batches = 1;
  o.max_inflight_bytes = 1000;
  Pipeline p(std::move(w), o, 0);
  ASSERT_TRUE(Eventually([&] { return p.counters().batches_done >= 4 && runs.load() >= 6; }))
      << p.counters().batches_done << " batches, " << runs.load() << " units";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // an overshoot would come now
  EXPECT_EQ(p.counters().batches_done, 4);
  EXPECT_EQ(runs.load(), 6);
  EXPECT_LE(p.counters().peak_inflight_bytes, 1000);
  // Taking batch 0 gives back its 200 bytes: batch 4 fits now.
  auto first = p.Next();
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(**first, (std::vector<int64_t>{0}));
  ASSERT_TRUE(Eventually([&] { return p.counters().batches_done >= 5; }));
  for (int64_t b = 1; b < 20; ++b) {
    auto r = p.Next();
    ASSERT_TRUE(r.ok());
    ASSERT_NE(*r, nullptr);
    EXPECT_EQ(**r, (std::vector<int64_t>{b * 10}));
  }
  EXPECT_EQ(p.counters().inflight_bytes, 0);
  // While the consumer drains, units read ahead may fill the budget before the batch it
  // waits for is made; that batch is made anyway (the floor: the consumer must move), so
  // the peak may pass the budget by one batch, never by more.
  EXPECT_LE(p.counters().peak_inflight_bytes, 1000 + 200);
}

TEST(OrderedPipeline, ShutdownFromAnotherThreadWakesAWaitingNext) {
  std::atomic<bool> release{false};
  std::atomic<int64_t> runs{0};
  Pipeline::Work w = MakeWork(4, &runs);
  w.run_unit = [&](int64_t u, int64_t* bytes) -> arrow::Result<std::shared_ptr<const int64_t>> {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    *bytes = 1;
    return std::make_shared<const int64_t>(u);
  };
  PipelineOptions o;
  o.num_workers = 2;
  Pipeline p(std::move(w), o, 0);
  auto next = std::async(std::launch::async, [&] { return p.Next(); });
  EXPECT_EQ(next.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  auto stopper = std::async(std::launch::async, [&] { p.Shutdown(); });
  ASSERT_EQ(next.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "Next() did not wake on Shutdown()";
  auto r = next.get();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsCancelled()) << r.status().ToString();
  release = true;  // the running units finish; Shutdown joins the workers
  stopper.get();
}

TEST(OrderedPipeline, NextWithATimeoutReturnsWhenNoBatchCame) {
  std::atomic<bool> release{false};
  std::atomic<int64_t> runs{0};
  Pipeline::Work w = MakeWork(2, &runs);
  w.run_unit = [&](int64_t u, int64_t* bytes) -> arrow::Result<std::shared_ptr<const int64_t>> {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    *bytes = 1;
    return std::make_shared<const int64_t>(u * 10);
  };
  Pipeline p(std::move(w), PipelineOptions{}, 0);
  bool timed_out = false;
  auto r = p.Next(std::chrono::milliseconds(20), &timed_out);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, nullptr);
  EXPECT_TRUE(timed_out);
  release = true;
  r = p.Next(std::chrono::seconds(10), &timed_out);  // the same batch, now ready
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(timed_out);
  ASSERT_NE(*r, nullptr);
  EXPECT_EQ(**r, (std::vector<int64_t>{0, 10}));
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
