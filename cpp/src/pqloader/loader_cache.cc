// Loader: what its cache is told. The identity of its entries (everything that changes
// a cached split's content is part of an entry's key), each split's key, and the view of
// the loader the cache schedules by (when the plans read a split, which files are stale).
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include <arrow/type_traits.h>
#include <parquet/schema.h>

#include "pqloader/cache/entry_format.h"
#include "pqloader/loader.h"
#include "pqloader/loader_internal.h"
#include "pqloader/plan/split_uses.h"
#include "pqloader/util/exact_text.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

namespace {

// The type of column `c`'s elements as file `f` stores them (inside its lists), or null.
const arrow::DataType* StoredElementType(const DataFile& f, size_t c) {
  const arrow::DataType* t = c < f.columns.size() ? f.columns[c].type.get() : nullptr;
  while (t != nullptr && (t->id() == arrow::Type::LIST || t->id() == arrow::Type::LARGE_LIST ||
                          t->id() == arrow::Type::FIXED_SIZE_LIST)) {
    t = static_cast<const arrow::BaseListType*>(t)->value_type().get();
  }
  return t == nullptr ? nullptr : &ValueType(*t);
}

// A cache key's part for a column of integers declared as floats: they are converted
// exactly since the values were checked (entries from before held rounded ones).
std::string IntegersAsFloats(const Dataset& dataset, size_t c) {
  const DType d = dataset.specs()[c].dtype;
  if (d != DType::kFloat16 && d != DType::kFloat32 && d != DType::kFloat64) return "";
  for (const DataFile& f : dataset.files()) {
    const arrow::DataType* t = StoredElementType(f, c);
    if (t != nullptr && arrow::is_integer(t->id())) return ":ints=exact";
  }
  return "";
}

// ":int96=range" when a file stores column `c` as INT96: its values are range-checked
// since the twenty-ninth session (dataset/int96.h), so entries written before (which
// may hold wrapped dates) are not served; read in another unit than nanoseconds (the
// thirty-seventh session), ":int96=<unit>" (a column declared as timestamp[ns] holds the
// same type either way).
std::string Int96Checked(const Dataset& dataset, size_t c) {
  for (const DataFile& f : dataset.files()) {
    if (c >= f.columns.size() || f.columns[c].leaves.empty()) continue;
    const parquet::SchemaDescriptor* schema = f.schema();
    for (int leaf : f.columns[c].leaves) {
      if (schema->Column(leaf)->physical_type() != parquet::Type::INT96) continue;
      const arrow::TimeUnit::type unit = dataset.int96_unit();
      return unit == arrow::TimeUnit::NANO ? ":int96=range"
                                           : ":int96=" + arrow::internal::ToString(unit);
    }
  }
  return "";
}

// ":decimals=rescaled" when a file stores float64 column `c` as decimals of a smaller
// scale than the column's: they are rescaled to it before the conversion since the
// thirty-fourth session (decode/convert.cc), so entries written before (converted at the
// file's scale, an ulp off pyarrow's) are not served; "rescaled2" since the thirty-sixth,
// whose rescale no longer wraps past 38 digits nor converts a decimal256 column's scale
// above 38 as a Decimal128's (entries written before could hold those wrong doubles).
std::string DecimalsRescaled(const Dataset& dataset, size_t c) {
  const ColumnSpec& spec = dataset.specs()[c];
  if (spec.decimal_scale < 0 || spec.dtype != DType::kFloat64) return "";
  for (const DataFile& f : dataset.files()) {
    const arrow::DataType* t = StoredElementType(f, c);
    if (t != nullptr && arrow::is_decimal(t->id()) &&
        static_cast<const arrow::DecimalType&>(*t).scale() < spec.decimal_scale) {
      return ":decimals=rescaled2";
    }
  }
  return "";
}

}  // namespace

// What the cache knows of this loader: the keys of its splits (computed on first use),
// when the plans of the current and the next epoch read them (for CachePolicy::kPlan, on
// the clock of plan/split_uses.h), and the versions of its files, to tell stale entries.
class Loader::CacheView : public CacheSchedule {
 public:
  explicit CacheView(const Loader* loader)
      : loader_(loader), split_rows_(loader->dataset_->SplitRows()), plan_(loader->options_.plan) {
    for (size_t f = 0; f < loader->dataset_->files().size(); ++f) {
      file_of_path_[loader->dataset_->files()[f].display] = f;
    }
  }
  bool Owns(const std::string& key) const override { return SplitOf(key) >= 0; }
  bool IsStale(const SourceIdentity& source) const override {
    auto it = file_of_path_.find(source.path);
    if (it == file_of_path_.end()) return false;  // not a file of this loader
    const DataFile& f = loader_->dataset_->files()[it->second];
    return !source.SameFileVersion(SourceIdentity{f.display, f.size, f.mtime_ns, f.footer_hash, 0});
  }
  double NextUse(const std::string& key, double now) const override {
    const int64_t split = SplitOf(key);
    if (split < 0 || !(now >= 0)) return kNeverUsed;
    const auto epoch = static_cast<int64_t>(now);
    for (int64_t e = epoch; e <= epoch + 1; ++e) {  // the plans of this epoch and the next
      const double t = UsesOf(e)->NextRead(split, now);
      if (t != kNeverRead) return t;
    }
    return kNeverUsed;
  }
  /// Follow the plan options of the epochs being read (the seed may change).
  void set_plan(const PlanOptions& plan) {
    MutexLock lock(mu_);
    if (plan.seed == plan_.seed) return;  // the rest is fixed at Make()
    plan_ = plan;
    uses_.clear();
  }

 private:
  int64_t SplitOf(const std::string& key) const {
    std::call_once(keys_once_, [this] {
      const auto n = static_cast<int64_t>(loader_->dataset_->splits().size());
      for (int64_t s = 0; s < n; ++s) split_of_key_[loader_->CacheKeyOf(s)] = s;
    });
    auto it = split_of_key_.find(key);
    return it == split_of_key_.end() ? -1 : it->second;
  }
  std::shared_ptr<const EpochSplitUses> UsesOf(int64_t epoch) const {
    constexpr size_t kEpochsKept = 4;
    MutexLock lock(mu_);
    auto it = uses_.find(epoch);
    if (it != uses_.end()) return it->second;
    if (uses_.size() >= kEpochsKept) uses_.erase(uses_.begin());
    auto uses = std::make_shared<const EpochSplitUses>(EpochSplitUses::Make(split_rows_, plan_, epoch));
    uses_[epoch] = uses;
    return uses;
  }

  const Loader* loader_;  // owns the cache, which owns this
  const std::vector<int64_t> split_rows_;
  std::unordered_map<std::string, size_t> file_of_path_;
  mutable std::once_flag keys_once_;
  mutable std::unordered_map<std::string, int64_t> split_of_key_;  // set once by keys_once_
  mutable Mutex mu_;
  PlanOptions plan_ PQ_GUARDED_BY(mu_);
  mutable std::map<int64_t, std::shared_ptr<const EpochSplitUses>> uses_ PQ_GUARDED_BY(mu_);
};

void Loader::SetUpCache() {
  cache_ = SplitCache::Open(options_.cache);
  // Everything that changes a cached split's content is part of its key.
  std::string id = "pqloader-cache-v" + std::to_string(kCacheFormatVersion);
  for (size_t c = 0; c < dataset_->specs().size(); ++c) {
    const ColumnSpec& spec = dataset_->specs()[c];
    const NullFill& f = read_options_.fills[c];
    id += "|col=" + spec.name + ":" + spec.arrow_type + ":fill=" +
          (f.enabled ? std::to_string(f.is_float) + "," + std::to_string(f.int_value) + "," +
                           ExactText(f.float_value) + "," + f.bytes_value +
                           (f.rows_only ? ",rows" : "") +
                           (f.list_length >= 0 ? ",len" + std::to_string(f.list_length)
                            // (before the fifty-second session, where the footers told no
                            // length, a row group of null lists only was kept as rows of 0)
                            : FillLengthFromRowGroup(spec, read_options_, c) ? ",len=rowgroup"
                                                                              : "") +
                           // (before the forty-second session, such a fill was written 2^63)
                           (spec.dtype == DType::kUInt64 && f.is_float && f.float_value >= 0x1p63
                                ? ",u64-exact"
                                : "")
                     : "none") +
          IntegersAsFloats(*dataset_, c) + Int96Checked(*dataset_, c) +
          DecimalsRescaled(*dataset_, c) +
          ":ragged=" + std::to_string(read_options_.allow_ragged[c]) +
          ":dtype=" + DTypeName(spec.dtype) + ":mask_of=" + std::to_string(spec.mask_of);
  }
  id += "|prefix=" + transforms_.PrefixFingerprint();
  id += "|skip=" + std::to_string(options_.on_decode_error == DecodeErrorPolicy::kSkip);
  // Since the fortieth session a null row (null_mask=) whose fill its ops cannot take is
  // an error, never skipped: entries written before under "skip" dropped such rows
  // (row_ok 0), which a loader of today must not serve.
  if (options_.on_decode_error == DecodeErrorPolicy::kSkip &&
      std::any_of(dataset_->specs().begin(), dataset_->specs().end(),
                  [](const ColumnSpec& s) { return s.mask_of >= 0; })) {
    id += ":masked-nulls=raise";
  }
  // Pages are CRC-checked only with verify_checksums: an entry decoded without the check
  // may hold a damaged page's values, which a verifying loader must refuse.
  if (options_.verify_checksums) id += "|crc=verified";
  // Strings read as bytes are not UTF-8 checked: their entries must not serve str reads.
  if (options_.dataset.columns.spec.strings_as_bytes) id += "|strings=bytes";
  cache_identity_ = id;
  cache_view_ = std::make_shared<CacheView>(this);
  cache_->set_schedule(cache_view_);
  // A filter's selection that could not be saved into cache_dir/filters (a full or
  // read-only disk) is a cache write failure too: counted and warned once (it was silent).
  if (!filter_stats_.store_error.empty()) cache_->CountWriteFailure(filter_stats_.store_error);
  // So are documents' lengths not saved into cache_dir/lengths (pack=).
  if (lengths_ != nullptr && !lengths_->store_error().empty()) {
    cache_->CountWriteFailure(lengths_->store_error());
  }
  // So is a remote footer not saved into cache_dir/footers (it was dropped silently).
  for (int64_t i = 0; i < dataset_->footers_unsaved(); ++i) {
    cache_->CountWriteFailure(dataset_->footer_store_error());
  }
}

void Loader::CacheFollowsPlan() {
  if (cache_view_ != nullptr) cache_view_->set_plan(options_.plan);
}

std::string Loader::CacheKeyOf(int64_t split_index) const {
  const Split& split = dataset_->splits()[split_index];
  const DataFile& file = dataset_->files()[split.file];
  // The selected partition keys' values as this root's path gives them (length-prefixed):
  // the same file below another root can have others (a key twice in a path).
  std::string keys;
  const auto& key_of = dataset_->partition_index();
  for (size_t c = 0; c < key_of.size(); ++c) {
    if (key_of[c] < 0) continue;
    const std::string& value = file.partition_values[key_of[c]];
    keys += "|key" + std::to_string(c) + "=" +
            (file.partition_null[key_of[c]] ? std::string("null")
                                            : std::to_string(value.size()) + ":" + value);
  }
  return CacheKey(cache_identity_ + "|file=" + file.display + "|size=" + std::to_string(file.size) +
                  "|mtime=" + std::to_string(file.mtime_ns) + "|footer=" + file.footer_hash +
                  "|row_group=" + std::to_string(split.row_group) +
                  "|rows=" + SelectionFingerprint(split) + keys);
}

}  // namespace pqloader
