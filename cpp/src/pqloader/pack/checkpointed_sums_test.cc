#include "pqloader/pack/checkpointed_sums.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace pqloader {
namespace {

// Every query against a full prefix-sum array and the standard library's searches, for
// sequences that end before, on and after a checkpoint, with runs of zeros (documents of
// no tokens) and values up to 2^31 (a document's tokens and its separator).
TEST(CheckpointedSums, MatchesAFullPrefixSum) {
  std::mt19937 rng(11);
  for (int64_t n : {0, 1, 63, 64, 65, 127, 128, 129, 1000}) {
    for (int zeros : {0, 1, 2}) {  // none, some, all
      std::vector<uint32_t> values(static_cast<size_t>(n));
      for (auto& v : values) {
        const bool zero = zeros == 2 || (zeros == 1 && rng() % 3 == 0);
        v = zero ? 0 : 1 + rng() % 9;
      }
      if (n > 5 && zeros == 0) values[5] = uint32_t{1} << 31;
      CheckpointedSums<uint32_t> assigned;
      assigned.Assign(values);
      CheckpointedSums<uint32_t> reassigned;  // a second Assign starts afresh
      reassigned.Assign(std::vector<uint32_t>(3, 7));
      reassigned.Assign(values);
      std::vector<int64_t> prefix(1, 0);
      for (uint32_t v : values) prefix.push_back(prefix.back() + v);
      for (const auto* sums : {&assigned, &reassigned}) {
        SCOPED_TRACE(testing::Message() << "n " << n << " zeros " << zeros);
        ASSERT_EQ(sums->size(), n);
        ASSERT_EQ(sums->total(), prefix.back());
        for (int64_t i = 0; i <= n; ++i) ASSERT_EQ(sums->Before(i), prefix[i]) << i;
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ((*sums)[i], values[i]);
        for (int64_t a = 0; a <= std::min<int64_t>(n, 70); ++a) {
          for (int64_t b = a; b <= n; ++b) ASSERT_EQ(sums->Sum(a, b), prefix[b] - prefix[a]);
        }
        // The searches at every total up to the end (and past it), around the big value.
        std::vector<int64_t> ts;
        for (int64_t t = 0; t <= std::min<int64_t>(prefix.back(), 5000) + 2; ++t) ts.push_back(t);
        for (int64_t p : prefix) {
          for (int64_t d : {-1, 0, 1}) {
            if (p + d >= 0) ts.push_back(p + d);
          }
        }
        for (int64_t t : ts) {
          const auto last = std::upper_bound(prefix.begin(), prefix.end(), t) - prefix.begin() - 1;
          const auto first = std::lower_bound(prefix.begin(), prefix.end(), t) - prefix.begin();
          ASSERT_EQ(sums->LastAtOrBelow(t), last) << "t " << t;
          ASSERT_EQ(sums->FirstAtOrAbove(t), first) << "t " << t;
        }
      }
    }
  }
}

}  // namespace
}  // namespace pqloader
