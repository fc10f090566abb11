#include "pqloader/filter/row_filter.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include <arrow/array.h>
#include <arrow/array/concatenate.h>
#include <arrow/buffer.h>
#include <arrow/compute/api_scalar.h>
#include <arrow/compute/api_vector.h>
#include <arrow/compute/cast.h>
#include <arrow/compute/exec.h>
#include <arrow/compute/expression.h>
#include <arrow/compute/initialize.h>
#include <arrow/compute/registry.h>
#include <arrow/io/interfaces.h>
#include <arrow/scalar.h>
#include <arrow/util/config.h>
#include <arrow/table.h>
#include <arrow/type.h>
#include <arrow/type_traits.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/file_reader.h>
#include <parquet/statistics.h>

#include "pqloader/cache/footer_cache.h"
#include "pqloader/cache/split_cache.h"
#include "pqloader/dataset/bounded_read.h"
#include "pqloader/dataset/column_types.h"
#include "pqloader/dataset/columns.h"
#include "pqloader/dataset/footer_checks.h"
#include "pqloader/dataset/int96.h"
#include "pqloader/error.h"
#include "pqloader/util/container_limits.h"
#include "pqloader/util/node_lock.h"
#include "pqloader/util/parallel_for.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {
namespace cp = arrow::compute;

namespace {

arrow::Status InitializeCompute() {
  // Registers the compute kernels (comparisons, is_in, ...) of libarrow_compute; once.
  static const arrow::Status status = cp::Initialize();
  return status;
}

arrow::Result<cp::Expression> ReadExpression(const std::string& serialized) {
  ARROW_RETURN_NOT_OK(InitializeCompute());
  auto expr = cp::Deserialize(arrow::Buffer::FromString(serialized));
  if (!expr.ok()) {
    return arrow::Status::Invalid("filter: cannot read the expression: ",
                                  expr.status().message(),
                                  " (made by a pyarrow whose function options differ from Arrow ",
                                  ARROW_VERSION_STRING, "'s, which pqloader evaluates it with?)");
  }
  // A function the user's pyarrow has and the engine's Arrow lacks (pyarrow 26's modulo):
  // named here, not at the first file's bind as if the file were at fault.
  std::vector<const cp::Expression*> todo{&*expr};
  while (!todo.empty()) {
    const cp::Expression::Call* call = todo.back()->call();
    todo.pop_back();
    if (call == nullptr) continue;
    if (!cp::GetFunctionRegistry()->GetFunction(call->function_name).ok()) {
      return arrow::Status::Invalid("filter: function '", call->function_name,
                                    "' is not in pqloader's Arrow ", ARROW_VERSION_STRING,
                                    " (a function of another pyarrow version, or one registered "
                                    "in Python with pc.register_scalar_function, which the "
                                    "engine cannot call): write it with other functions, or as "
                                    "a pqloader.Predicate");
    }
    for (const cp::Expression& argument : call->arguments) todo.push_back(&argument);
  }
  return std::move(expr).ValueUnsafe();
}

// The most calls (comparisons, and/or/not, arithmetic) a filter may hold: Arrow's
// simplification recurses once per link of an and/or chain, whatever its shape (it
// flattens them), and 10,000 links overflowed a thread's stack (a segmentation fault;
// pyarrow's dataset crashes too), 5,000 did not. A value set (`isin`) is one call.
constexpr int64_t kMaxFilterCalls = 2000;

// The calls of `e`, counted without recursion (as deep as it is).
int64_t CountCalls(const cp::Expression& e) {
  int64_t calls = 0;
  std::vector<const cp::Expression*> todo{&e};
  while (!todo.empty()) {
    const cp::Expression* next = todo.back();
    todo.pop_back();
    const cp::Expression::Call* call = next->call();
    if (call == nullptr) continue;
    ++calls;
    for (const cp::Expression& argument : call->arguments) todo.push_back(&argument);
  }
  return calls;
}

bool IsLiteralTrue(const cp::Expression& e) {
  const arrow::Datum* d = e.literal();
  if (d == nullptr || !d->is_scalar() || !d->scalar()->is_valid) return false;
  const auto* b = dynamic_cast<const arrow::BooleanScalar*>(d->scalar().get());
  return b != nullptr && b->value;
}

// Whether `e` holds a floating-point NaN literal (a scalar, or, with `value_sets`, in an
// is_in/index_in value set). Arrow's SimplifyWithGuarantee orders NaN above every bound, so
// with statistics it folds "x < NaN" over [1, 4] to true and "not (x < NaN)" to false, where
// comparisons with NaN are false for every row: such a filter gets no statistics.
bool HasNanLiteral(const cp::Expression& e, bool value_sets = true) {
  auto is_nan = [](const arrow::Scalar& scalar) {
    if (!scalar.is_valid) return false;
    if (const auto* d = dynamic_cast<const arrow::DoubleScalar*>(&scalar)) return std::isnan(d->value);
    if (const auto* f = dynamic_cast<const arrow::FloatScalar*>(&scalar)) return std::isnan(f->value);
    if (const auto* h = dynamic_cast<const arrow::HalfFloatScalar*>(&scalar)) {
      return (h->value & 0x7c00) == 0x7c00 && (h->value & 0x03ff) != 0;
    }
    return false;
  };
  // A value set: only floating-point ones are scanned, over their raw values.
  auto array_has_nan = [](const arrow::Array& array) {
    const arrow::Array* values = &array;
    if (array.type_id() == arrow::Type::DICTIONARY) {
      values = static_cast<const arrow::DictionaryArray&>(array).dictionary().get();
    }
    const int64_t n = values->length();
    switch (values->type_id()) {
      case arrow::Type::DOUBLE: {
        const double* v = static_cast<const arrow::DoubleArray&>(*values).raw_values();
        for (int64_t i = 0; i < n; ++i) if (std::isnan(v[i]) && values->IsValid(i)) return true;
        return false;
      }
      case arrow::Type::FLOAT: {
        const float* v = static_cast<const arrow::FloatArray&>(*values).raw_values();
        for (int64_t i = 0; i < n; ++i) if (std::isnan(v[i]) && values->IsValid(i)) return true;
        return false;
      }
      case arrow::Type::HALF_FLOAT: {
        const uint16_t* v = static_cast<const arrow::HalfFloatArray&>(*values).raw_values();
        for (int64_t i = 0; i < n; ++i) {
          if ((v[i] & 0x7c00) == 0x7c00 && (v[i] & 0x03ff) != 0 && values->IsValid(i)) return true;
        }
        return false;
      }
      default:
        return false;
    }
  };
  auto datum_has_nan = [&](const arrow::Datum& datum) {
    if (datum.is_scalar()) return is_nan(*datum.scalar());
    if (!datum.is_arraylike()) return false;
    for (const auto& chunk : datum.chunks()) {
      if (array_has_nan(*chunk)) return true;
    }
    return false;
  };
  if (const arrow::Datum* d = e.literal()) return datum_has_nan(*d);
  const cp::Expression::Call* call = e.call();
  if (call == nullptr) return false;
  if (const auto* set = dynamic_cast<const cp::SetLookupOptions*>(call->options.get())) {
    if (value_sets && datum_has_nan(set->value_set)) return true;
  }
  for (const cp::Expression& arg : call->arguments) {
    if (HasNanLiteral(arg, value_sets)) return true;
  }
  return false;
}

// Whether bound `e` looks a decimal column up in a set of floats (is_in, index_in): Arrow's
// kernel casts the set to the decimal type, rounding each value to its scale (4.996 in a
// decimal(9, 2) column's set is 5.00), where SimplifyWithGuarantee compares the statistics'
// bounds with the float itself (5.00..5.99 "cannot hold" 4.996): row groups of 100 rows
// kept nothing where one row group kept 5.00. Such a filter gets no statistics.
bool HasFloatSetOfDecimals(const cp::Expression& e) {
  const cp::Expression::Call* call = e.call();
  if (call == nullptr) return false;
  if (const auto* set = dynamic_cast<const cp::SetLookupOptions*>(call->options.get())) {
    const arrow::DataType* column = call->arguments.empty() ? nullptr : call->arguments[0].type();
    const std::shared_ptr<arrow::DataType> values = set->value_set.type();
    if (column != nullptr && values != nullptr && arrow::is_decimal(column->id())) {
      const arrow::DataType& v =
          values->id() == arrow::Type::DICTIONARY
              ? *static_cast<const arrow::DictionaryType&>(*values).value_type()
              : *values;
      if (arrow::is_floating(v.id())) return true;
    }
  }
  for (const cp::Expression& arg : call->arguments) {
    if (HasFloatSetOfDecimals(arg)) return true;
  }
  return false;
}

// A file that remembers whether a read of it failed: Parquet C++ gives storage failures
// and data it cannot decode ("Corrupt snappy compressed data", a page header's thrift)
// alike, as IOErrors, in the middle of decoding (the filter reads without pre-buffering).
// Whether `t` is a time with a unit: a timestamp, a duration, a time32 or a time64.
bool IsTimeOfUnit(const arrow::DataType& t) {
  using T = arrow::Type;
  return t.id() == T::TIMESTAMP || t.id() == T::DURATION || t.id() == T::TIME32 || t.id() == T::TIME64;
}

// The finer of two times of one kind in other units (timestamps of one time zone,
// durations, time32 and time64), to which the other converts exactly; null otherwise.
std::shared_ptr<arrow::DataType> FinerTime(const std::shared_ptr<arrow::DataType>& a,
                                           const std::shared_ptr<arrow::DataType>& b) {
  using T = arrow::Type;
  if (a == nullptr || b == nullptr) return nullptr;
  const auto is_time = [](T::type id) { return id == T::TIME32 || id == T::TIME64; };
  const bool one_kind = (a->id() == b->id() && (a->id() == T::TIMESTAMP || a->id() == T::DURATION)) ||
                        (is_time(a->id()) && is_time(b->id()));
  if (!one_kind) return nullptr;
  if (a->id() == T::TIMESTAMP && static_cast<const arrow::TimestampType&>(*a).timezone() !=
                                     static_cast<const arrow::TimestampType&>(*b).timezone()) {
    return nullptr;  // other zones: refused, as loading them is
  }
  const auto unit = [](const arrow::DataType& t) -> int {  // SECOND < MILLI < MICRO < NANO
    if (t.id() == T::TIMESTAMP) return static_cast<int>(static_cast<const arrow::TimestampType&>(t).unit());
    if (t.id() == T::DURATION) return static_cast<int>(static_cast<const arrow::DurationType&>(t).unit());
    return static_cast<int>(static_cast<const arrow::TimeType&>(t).unit());
  };
  return unit(*a) >= unit(*b) ? a : b;
}

class ReadFailureRecorder final : public arrow::io::RandomAccessFile {
 public:
  explicit ReadFailureRecorder(std::shared_ptr<arrow::io::RandomAccessFile> inner)
      : inner_(std::move(inner)) {}
  bool failed() const { return failed_.load(); }

  arrow::Status Close() override { return inner_->Close(); }
  bool closed() const override { return inner_->closed(); }
  arrow::Result<int64_t> Tell() const override { return inner_->Tell(); }
  arrow::Status Seek(int64_t position) override { return Note(inner_->Seek(position)); }
  arrow::Result<int64_t> GetSize() override { return Note(inner_->GetSize()); }
  arrow::Result<int64_t> Read(int64_t n, void* out) override { return Note(inner_->Read(n, out)); }
  arrow::Result<std::shared_ptr<arrow::Buffer>> Read(int64_t n) override {
    return Note(inner_->Read(n));
  }
  arrow::Result<int64_t> ReadAt(int64_t position, int64_t n, void* out) override {
    return Note(inner_->ReadAt(position, n, out));
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(int64_t position, int64_t n) override {
    return Note(inner_->ReadAt(position, n));
  }

 private:
  template <typename T>
  T Note(T result) {
    if (!result.ok()) failed_ = true;
    return result;
  }
  std::shared_ptr<arrow::io::RandomAccessFile> inner_;
  std::atomic<bool> failed_{false};
};

// Where one column the filter names is in one file.
struct FileField {
  std::shared_ptr<arrow::Field> field;  // the file's own field, null if absent
  std::vector<int> leaves;              // its Parquet leaf columns
  bool extension = false;               // an extension type's storage: no statistics
};

// The filter's columns as one file has them, and the expression bound to them.
struct FileView {
  std::vector<FileField> fields;           // per name
  std::shared_ptr<arrow::Schema> schema;   // binding schema (per name: its target, file's or fallback type)
  cp::Expression bound;                    // the expression, bound to `schema`
  std::shared_ptr<arrow::Schema> predicate_schema;
  bool no_statistics = false;  // `bound` (constants folded) holds a NaN, or a float set of decimals
};

// What the evaluation shares across threads.
class Evaluator {
 public:
  Evaluator(const Dataset& dataset, const FilterOptions& options)
      : dataset_(dataset), options_(options) {}

  arrow::Status Prepare() {
    if (!options_.serialized_expression.empty()) {
      ARROW_ASSIGN_OR_RAISE(expr_, ReadExpression(options_.serialized_expression));
      if (const int64_t calls = CountCalls(expr_); calls > kMaxFilterCalls) {
        return arrow::Status::Invalid("filter: ", calls, " comparisons, and/or/not and other calls, "
                                      "more than the ", kMaxFilterCalls, " Arrow evaluates safely: "
                                      "name many values with isin (in a string: 'x in [...]')");
      }
      for (const arrow::FieldRef& ref : cp::FieldsInExpression(expr_)) {
        if (ref.name() == nullptr) {
          return arrow::Status::Invalid("filter: ", ref.ToString(),
                                        " is not a column name; filters name top-level "
                                        "columns and partition keys");
        }
        AddName(*ref.name());
      }
    } else {
      ARROW_RETURN_NOT_OK(InitializeCompute());
      expr_ = cp::literal(true);
    }
    for (const auto& name : options_.predicate_columns) AddName(name);
    if (options_.predicate != nullptr && options_.predicate_columns.empty()) {
      return arrow::Status::Invalid("filter: a predicate needs the columns it reads");
    }
    {
      MutexLock lock(mu_);
      views_.resize(dataset_.files().size());
      manifest_of_.resize(dataset_.files().size());
    }
    // Each name's type where a file lacks it: the first file's that has it.
    std::map<std::string, std::shared_ptr<arrow::DataType>> first_type;
    for (size_t f = 0; f < dataset_.files().size(); ++f) {
      ARROW_ASSIGN_OR_RAISE(auto manifest, ManifestOf(f));
      for (const auto& sf : manifest->schema_fields) {
        first_type.emplace(sf.field->name(), sf.field->type());
      }
      // A name two top-level columns of a file share: which one the filter reads is
      // ambiguous (ViewOf took both's leaves and the read failed late, as "cannot read
      // column", at the first row group).
      for (const auto& name : names_) {
        const auto n = std::count_if(manifest->schema_fields.begin(), manifest->schema_fields.end(),
                                     [&name](const auto& sf) { return sf.field->name() == name; });
        if (n > 1) {
          return MakeError(ErrorKind::kInvalidData, "'", dataset_.files()[f].display, "' has ", n,
                           " columns named '", name, "': which one the filter reads is "
                           "ambiguous; filter on other columns");
        }
      }
    }
    // Partition keys as the Dataset loads them (dataset/columns.h, KeyLoad): a key the
    // files store (Polars' partition_by) is a file column here too, of the files' type
    // (the footers' checks hold its values to the path's); one from the paths is int64
    // or text, as declared or as its values read. A key twice in a path has its first
    // value, as the Dataset (and pyarrow) load it.
    const auto& keys = dataset_.partition_keys();
    const auto& loads = dataset_.key_loads();
    const auto& key_errors = dataset_.key_errors();
    for (size_t k = 0; k < keys.size() && k < key_errors.size(); ++k) {
      // A key some files store and others lack (columns.h): named here, it would load as
      // null in the others.
      if (!key_errors[k].ok() &&
          std::find(names_.begin(), names_.end(), keys[k]) != names_.end()) {
        return key_errors[k];
      }
    }
    // A key the files store, selected or read by this filter, must agree with the paths
    // before the filter restricts the row groups (it may prune the ones that disagree by
    // those very statistics, and the later check would see none of them).
    ARROW_RETURN_NOT_OK(CheckStoredKeys(dataset_, names_));
    for (size_t k = 0; k < keys.size(); ++k) {
      if (key_index_.count(keys[k]) || k >= loads.size() || loads[k] == KeyLoad::kFiles) continue;
      key_types_[keys[k]] = loads[k] == KeyLoad::kInt64 ? arrow::int64() : arrow::utf8();
      key_index_[keys[k]] = static_cast<int>(k);
    }
    for (const auto& name : names_) {
      auto it = first_type.find(name);
      if (!key_types_.count(name) && it != first_type.end()) fallback_[name] = it->second;
    }
    for (const auto& name : names_) {
      if (!fallback_.count(name) && !key_types_.count(name)) {
        return MakeError(ErrorKind::kColumnNotFound, "filter names column '", name,
                         "', which is neither a column of any file nor a partition key");
      }
    }
    return FindTargets();
  }

  // "name:type" of each column the filter sees in another type than some file stores
  // (for the selection store's key: a declared schema changes what a filter selects).
  std::string TargetsText() const {
    std::string out;
    for (const auto& [name, type] : target_) out.append("|as=").append(name).append(":").append(type->ToString());
    return out;
  }

  // Stages 1 and 2 for file f: each split's stage, and the expressions left for masks.
  arrow::Status PruneFile(size_t f, const std::vector<int64_t>& splits, RowSelection* out,
                          std::vector<std::pair<int64_t, cp::Expression>>* to_mask) {
    const DataFile& file = dataset_.files()[f];
    ARROW_ASSIGN_OR_RAISE(const FileView* view, ViewOf(f));
    cp::Expression by_keys = view->bound;
    std::vector<cp::Expression> known;
    for (const auto& [name, k] : key_index_) {
      if (!view->schema->GetFieldByName(name)) continue;
      if (file.partition_null[k]) {
        known.push_back(cp::is_null(cp::field_ref(name)));
      } else if (key_types_.at(name)->id() == arrow::Type::INT64) {
        known.push_back(cp::equal(cp::field_ref(name),
                                  cp::literal(static_cast<int64_t>(std::stoll(file.partition_values[k])))));
      } else {
        known.push_back(cp::equal(cp::field_ref(name), cp::literal(file.partition_values[k])));
      }
    }
    if (!known.empty()) {
      ARROW_ASSIGN_OR_RAISE(auto guarantee, cp::and_(known).Bind(*view->schema));
      // Evaluates the filter's calls on the keys' values (divide_checked(p, 0)): a failure
      // names the file and its keys, as one on the files' columns does.
      auto simplified = cp::SimplifyWithGuarantee(by_keys, guarantee);
      if (!simplified.ok()) {
        std::string keys;
        for (const auto& [name, k] : key_index_) {
          if (!view->schema->GetFieldByName(name)) continue;
          keys += (keys.empty() ? "" : ", ") + name + "=" +
                  (file.partition_null[k] ? std::string("null") : file.partition_values[k]);
        }
        return WithContext(simplified.status(), "cannot evaluate the filter " +
                                                    view->bound.ToString() +
                                                    " on the partition keys of '" + file.display +
                                                    "' (" + keys + ")");
      }
      by_keys = std::move(simplified).ValueUnsafe();
    }
    // A NaN the keys' values make ("not (x < sqrt(k - 1))" in a file under k=0/) is a NaN
    // literal now, which the statistics must not see (HasNanLiteral): they pruned every
    // row group of such a file, whose rows all pass. (Value sets: the view's check.)
    bool no_statistics = view->no_statistics;
    if (!known.empty() && !no_statistics) {
      auto folded = cp::FoldConstants(by_keys);
      no_statistics = HasNanLiteral(folded.ok() ? *folded : by_keys, /*value_sets=*/false);
    }
    if (!by_keys.IsSatisfiable()) {
      for (int64_t s : splits) out->stage[s] = RowSelection::Stage::kPartition;
      return arrow::Status::OK();
    }
    for (int64_t s : splits) {
      const Split& split = dataset_.splits()[s];
      // Statistics only prune, as in pyarrow's scanner: a row group they show wholly kept
      // is still read for its mask, with the whole expression. Kept unread (or masked by
      // the expression they simplified), statistics that lied (min == max == 5 over
      // 0..99) kept every row for `x == 5`, and `x == 5 and y > 3` checked only `y > 3`.
      cp::Expression simplified = by_keys;
      if (!no_statistics) {
        ARROW_ASSIGN_OR_RAISE(simplified, WithStatistics(file, split, *view, by_keys));
      }
      if (!simplified.IsSatisfiable()) {
        out->stage[s] = RowSelection::Stage::kStatistics;
      } else if (IsLiteralTrue(by_keys) && options_.predicate == nullptr) {
        out->stage[s] = RowSelection::Stage::kAll;  // decided by the path, exactly
      } else {
        to_mask->emplace_back(s, by_keys);
      }
    }
    return arrow::Status::OK();
  }

  // Stage 3 for split s: the kept rows, or null when none is kept.
  arrow::Result<std::shared_ptr<const std::vector<int32_t>>> Mask(int64_t s,
                                                                   const cp::Expression& expr,
                                                                   int64_t* bytes_read) {
    const Split& split = dataset_.splits()[s];
    const DataFile& file = dataset_.files()[split.file];
    const std::string where =
        "'" + file.display + "', row group " + std::to_string(split.row_group);
    ARROW_ASSIGN_OR_RAISE(const FileView* view, ViewOf(split.file));
    const int64_t n = split.file_rows;
    std::map<std::string, std::shared_ptr<arrow::Array>> columns;
    ARROW_RETURN_NOT_OK(ReadColumns(file, split, *view, where, &columns, bytes_read));
    // After the read checked the footer's row count against the data: a false count of
    // 2^31 rows would have been touched here first (2 GB for a 7 KB file).
    std::vector<uint8_t> keep(static_cast<size_t>(n), 1);
    // A column must be of its view's type: a batch made with another would read its
    // buffers as that type.
    for (const auto& field : view->schema->fields()) {
      const auto& column = columns[field->name()];
      if (column != nullptr && !column->type()->Equals(*field->type())) {
        return MakeError(ErrorKind::kInvalidData, "cannot filter ", where, ": column '",
                         field->name(), "' was read as ", column->type()->ToString(),
                         ", not as its schema's ", field->type()->ToString());
      }
    }
    if (!IsLiteralTrue(expr)) {
      arrow::ArrayVector values;
      for (const auto& field : view->schema->fields()) values.push_back(columns[field->name()]);
      auto batch = arrow::RecordBatch::Make(view->schema, n, values);
      auto result = cp::ExecuteScalarExpression(expr, cp::ExecBatch(*batch));
      if (!result.ok()) {
        return WithContext(result.status(), "cannot evaluate the filter " + expr_.ToString() + " on " +
                                                where + " (" +
                                                view->schema->ToString(/*show_metadata=*/false) + ")");
      }
      ARROW_RETURN_NOT_OK(AndInto(*result, n, &keep, where, "the filter"));
    }
    if (options_.predicate != nullptr) {
      arrow::ArrayVector values;
      for (const auto& name : options_.predicate_columns) values.push_back(columns[name]);
      auto batch = arrow::RecordBatch::Make(view->predicate_schema, n, values);
      // A C++ caller's predicate may throw or give no array: both are its error, not a crash.
      arrow::Result<std::shared_ptr<arrow::Array>> result;
      try {
        result = options_.predicate(batch);
      } catch (const std::exception& e) {
        result = arrow::Status::Invalid("it threw: ", e.what());
      }
      if (result.ok() && *result == nullptr) result = arrow::Status::Invalid("it gave no array");
      if (!result.ok()) {
        // Cancelled: the predicate was interrupted (Ctrl-C): passed on as it is.
        if (result.status().IsCancelled()) return result.status();
        return WithContext(result.status(), "predicate failed on " + where);
      }
      ARROW_RETURN_NOT_OK(AndInto(arrow::Datum(*result), n, &keep, where, "the predicate"));
    }
    auto rows = std::make_shared<std::vector<int32_t>>();
    for (int64_t i = 0; i < n; ++i) {
      if (keep[i]) rows->push_back(static_cast<int32_t>(i));
    }
    if (rows->empty()) return nullptr;
    return rows;
  }

 private:
  void AddName(const std::string& name) {
    if (std::find(names_.begin(), names_.end(), name) == names_.end()) names_.push_back(name);
  }

  static bool IsNumber(const arrow::DataType& t) {
    // (not float16: Arrow's casts of it are not all there)
    return arrow::is_integer(t.id()) || t.id() == arrow::Type::FLOAT ||
           t.id() == arrow::Type::DOUBLE || IsDecimal(t.id());
  }

  // A list's (list, large_list, fixed_size_list) element type; else `t` itself.
  // (at its innermost level: lists of fixed-size lists too)
  static const arrow::DataType& ElementOf(const arrow::DataType& t) {
    const arrow::DataType* e = &t;
    while (IsListLike(e->id())) e = static_cast<const arrow::BaseListType&>(*e).value_type().get();
    return *e;
  }
  static int DepthOf(const arrow::DataType& t) {
    int depth = 0;
    for (const arrow::DataType* e = &t; IsListLike(e->id()); ++depth) {
      e = static_cast<const arrow::BaseListType&>(*e).value_type().get();
    }
    return depth;
  }
  // `t` with its innermost element type `element` (list kinds, field names, sizes kept).
  static std::shared_ptr<arrow::DataType> WithElement(const std::shared_ptr<arrow::DataType>& t,
                                                      const std::shared_ptr<arrow::DataType>& element) {
    if (!IsListLike(t->id())) return element;
    const auto& list = static_cast<const arrow::BaseListType&>(*t);
    auto field = list.value_field()->WithType(WithElement(list.value_type(), element));
    if (t->id() == arrow::Type::LARGE_LIST) return arrow::large_list(field);
    if (t->id() == arrow::Type::FIXED_SIZE_LIST) {
      return arrow::fixed_size_list(field, static_cast<const arrow::FixedSizeListType&>(*t).list_size());
    }
    return arrow::list(field);
  }

  // A numeric column whose files store it in other types (int32 here, int64 there;
  // decimals of other scales) or that schema= declares another type is compared in the
  // type the batches hold: the declared or loaded (unified) type, or for a column only
  // the filter reads, the type common to its files (CommonType). Each file's own type gave
  // other rows than pyarrow's dataset, which casts each file to the dataset's schema
  // first ("x / 2 == 1.5" divided an int64 file's x as integers, where the column loads
  // as float64) or failed ("a - b < 0" overflowed uint32, an isin of decimal(3, 2) could
  // not hold a decimal(5, 1) file's values).
  arrow::Status FindTargets() {
    const auto& out = dataset_.schema();
    for (const auto& name : names_) {
      if (key_types_.count(name)) continue;
      std::shared_ptr<arrow::DataType> target;
      const int i = out == nullptr ? -1 : out->GetFieldIndex(name);
      const auto& declared = dataset_.declared_schema();
      const int d = declared == nullptr ? -1 : declared->GetFieldIndex(name);
      if (d >= 0) {
        target = TypeWithoutExtension(declared->field(d)->type());
      } else if (i >= 0 && static_cast<size_t>(i) < dataset_.column_types().size() &&
                 dataset_.partition_index()[i] < 0) {
        target = dataset_.column_types()[i];
      }
      std::vector<std::shared_ptr<arrow::DataType>> stored;
      std::vector<size_t> stored_file;  // the first file of each entry of `stored`
      std::set<const parquet::arrow::SchemaManifest*> seen;  // (files mostly share a few)
      for (size_t f = 0; f < dataset_.files().size(); ++f) {
        ARROW_ASSIGN_OR_RAISE(auto manifest, ManifestOf(f));
        if (!seen.insert(manifest.get()).second) continue;
        for (const auto& sf : manifest->schema_fields) {
          if (sf.field->name() == name) {
            stored.push_back(TypeWithoutExtension(sf.field->type()));
            stored_file.push_back(f);
          }
        }
      }
      if (target == nullptr) {  // read by the filter only
        for (size_t k = 0; k < stored.size(); ++k) {
          auto common = target == nullptr ? stored[k] : CommonType(target, stored[k]);
          // Times of one kind in other units: the finer one, which the other converts to
          // exactly (each file's column is cast to it below).
          if (common == nullptr) common = FinerTime(target, stored[k]);
          if (common == nullptr) {
            // No common type: each file was compared in its own, which gave rows other
            // than one type's (y / 2 divided an int64 file's values as integers, and
            // list<int64> beside list<double> the same), and a literal failed in one
            // file's type, naming that file only. Refused as loading the column is,
            // whatever the order of the files.
            return MakeError(ErrorKind::kSchemaMismatch, "filter column '", name, "' has type ",
                             stored[0]->ToString(), " in '", dataset_.files()[stored_file[0]].display,
                             "' but type ", stored[k]->ToString(), " in '",
                             dataset_.files()[stored_file[k]].display,
                             "', and neither converts to the other without loss: declare the "
                             "type to compare it as with schema= where one does, or filter on "
                             "other columns");
          }
          target = common;
        }
      }
      if (target == nullptr) continue;
      ColumnKind kind;
      if (IsVarBinary(ValueType(*target).id(), &kind)) {
        // Strings and bytes: compared in the plain layout Arrow's kernels take, where a
        // file's has none (dictionary, fixed-size binary, views: "starts_with" had no
        // kernel for a dictionary file's column loaded as string; nothing compares
        // string_view) or is of the other kind (a string file of a column declared binary).
        const auto id = ValueType(*target).id();
        const bool large = id == arrow::Type::LARGE_STRING || id == arrow::Type::LARGE_BINARY ||
                           id == arrow::Type::STRING_VIEW || id == arrow::Type::BINARY_VIEW;
        auto plain = kind == ColumnKind::kString ? (large ? arrow::large_utf8() : arrow::utf8())
                                                 : (large ? arrow::large_binary() : arrow::binary());
        const bool needs = std::any_of(stored.begin(), stored.end(), [&](const auto& t) {
          ColumnKind k;
          const auto sid = t->id();
          return sid == arrow::Type::DICTIONARY || sid == arrow::Type::FIXED_SIZE_BINARY ||
                 sid == arrow::Type::STRING_VIEW || sid == arrow::Type::BINARY_VIEW ||
                 (IsVarBinary(sid, &k) && k != kind);
        });
        const bool all_text = std::all_of(stored.begin(), stored.end(), [](const auto& t) {
          ColumnKind k;
          return IsVarBinary(ValueType(*t).id(), &k) || t->id() == arrow::Type::NA;
        });
        if (needs && all_text) target_[name] = plain;
        continue;
      }
      if (IsTimeOfUnit(*target)) {
        // Times in other units, compared in the finest (a unit-dependent expression,
        // t.cast(int64) > 1500, gave each file's own unit's rows).
        const bool differs = std::any_of(stored.begin(), stored.end(), [&](const auto& t) {
          return !t->Equals(*target);
        });
        if (differs) target_[name] = target;
        continue;
      }
      // float16: no kernel compares it; as float32, which holds each value exactly.
      if (ElementOf(*target).id() == arrow::Type::HALF_FLOAT) target = WithElement(target, arrow::float32());
      // Numbers, or lists of numbers (list_element(l, 0) * 100000 wrapped in an int32
      // file's type where the column loads as list<int64>), at any list depth.
      if (!IsNumber(ElementOf(*target))) continue;
      const int depth = DepthOf(*target);
      const bool differs = std::any_of(stored.begin(), stored.end(), [&](const auto& t) {
        return !t->Equals(*target);
      });
      const bool all_numbers = std::all_of(stored.begin(), stored.end(), [&](const auto& t) {
        // (a file whose column is all null; a float16 file of a column loaded as float32
        // or float64: Arrow casts float16 to those exactly)
        const auto& element = ElementOf(*t);
        return t->id() == arrow::Type::NA ||
               (DepthOf(*t) == depth &&
                (IsNumber(element) ||
                 (element.id() == arrow::Type::HALF_FLOAT && arrow::is_floating(ElementOf(*target).id()))));
      });
      if (differs && all_numbers) target_[name] = target;
    }
    return arrow::Status::OK();
  }

  arrow::Result<std::shared_ptr<parquet::arrow::SchemaManifest>> ManifestOf(size_t f) {
    const DataFile& file = dataset_.files()[f];
    const parquet::SchemaDescriptor* descr = file.schema();
    // The Arrow schema a writer stored: string and large_string (binary, large_binary;
    // dictionary or not) share a Parquet schema and differ only there. A manifest of
    // another file read these columns as the first file's types (int64 offsets as int32).
    {
      MutexLock lock(mu_);  // (each file's is asked for several times: once per name, per view)
      if (manifest_of_[f] != nullptr) return manifest_of_[f];
    }
    const auto& kv = file.key_value_metadata();
    std::string arrow_schema;
    if (kv != nullptr) {
      const int i = kv->FindKey("ARROW:schema");
      if (i >= 0) arrow_schema = kv->value(i);
    }
    MutexLock lock(mu_);
    // Files of one dataset mostly share a schema: derive each distinct one once. (Files
    // from pandas differ in the stored schema's metadata, its index range: one manifest
    // each, found by the string in log time.)
    auto& same_stored = manifests_[arrow_schema];
    for (const auto& [d, m] : same_stored) {
      if (d == descr || d->Equals(*descr)) return manifest_of_[f] = m;
    }
    auto manifest = std::make_shared<parquet::arrow::SchemaManifest>();
    auto st = parquet::arrow::SchemaManifest::Make(descr, file.key_value_metadata(),
                                                   dataset_.ArrowProperties(), manifest.get());
    if (!st.ok()) {
      return MakeError(ErrorKind::kInvalidData, "'", file.display,
                       "': cannot derive an Arrow schema from its Parquet schema: ",
                       st.message());
    }
    same_stored.emplace_back(descr, manifest);
    return manifest_of_[f] = manifest;
  }

  arrow::Result<const FileView*> ViewOf(size_t f) {
    {
      MutexLock lock(mu_);
      if (views_[f] != nullptr) return views_[f].get();
    }
    ARROW_ASSIGN_OR_RAISE(auto manifest, ManifestOf(f));
    auto view = std::make_shared<FileView>();
    arrow::FieldVector fields;
    for (const auto& name : names_) {
      FileField ff;
      if (!key_types_.count(name)) {
        for (const auto& sf : manifest->schema_fields) {
          if (sf.field->name() != name) continue;
          // An extension column as it is read: its storage (dataset/column_types.h), whose
          // statistics need not order as its values do (bool8's int8 -1..1 is not true..true).
          ff.extension = sf.field->type()->id() == arrow::Type::EXTENSION;
          ff.field = sf.field->WithType(TypeWithoutExtension(sf.field->type()));
          LeavesOf(sf, &ff.leaves);
        }
      }
      auto target = target_.find(name);
      auto type = target != target_.end() ? target->second
                  : ff.field                ? ff.field->type()
                  : key_types_.count(name)  ? key_types_.at(name)
                                            : fallback_.at(name);
      fields.push_back(arrow::field(name, type));
      view->fields.push_back(std::move(ff));
    }
    view->schema = arrow::schema(fields);
    arrow::FieldVector pfields;
    for (const auto& name : options_.predicate_columns) {
      pfields.push_back(view->schema->GetFieldByName(name));
    }
    view->predicate_schema = arrow::schema(pfields);
    const std::string key = view->schema->ToString();
    MutexLock lock(mu_);
    auto it = bound_.find(key);
    if (it == bound_.end()) {
      auto bound = expr_.Bind(*view->schema);
      if (!bound.ok()) {
        // Spark infers decimal(38, 18) for Python Decimals: "amount < 0" is common there.
        const bool wide_decimal =
            bound.status().message().find("Precision is not great enough") != std::string::npos;
        return arrow::Status::Invalid(
            "filter ", expr_.ToString(), " does not apply to the columns of '",
            dataset_.files()[f].display, "' (", view->schema->ToString(/*show_metadata=*/false),
            "): ", bound.status().message(),
            wide_decimal ? " (an integer literal is an int64, compared as a decimal(19, 0), "
                           "which a decimal column of over 38 - 19 + its scale digits has no "
                           "common type with: write the literal as a decimal scalar of a small "
                           "precision, pa.scalar(Decimal(0), pa.decimal128(1, 0)), or as a "
                           "float, 0.0, compared as float64)"
                         : "");
      }
      if (bound->type()->id() != arrow::Type::BOOL) {
        return arrow::Status::TypeError("filter ", expr_.ToString(),
                                        " is not a condition: it gives ",
                                        bound->type()->ToString(), ", not bool");
      }
      it = bound_.emplace(key, *bound).first;
    }
    view->bound = it->second;
    // Folded first: "x < 0.0 / 0.0" is a NaN literal once Arrow folds it.
    auto folded = cp::FoldConstants(view->bound);
    const cp::Expression& e = folded.ok() ? *folded : view->bound;
    view->no_statistics = HasNanLiteral(e) || HasFloatSetOfDecimals(e);
    views_[f] = view;
    return view.get();
  }

  // `expr` simplified with what `split`'s statistics guarantee of each filter column.
  arrow::Result<cp::Expression> WithStatistics(const DataFile& file, const Split& split,
                                               const FileView& view, cp::Expression expr) {
    if (view.no_statistics) return expr;
    std::vector<cp::Expression> known;
    try {
      auto rg = file.RowGroup(split.row_group);
      for (size_t i = 0; i < names_.size(); ++i) {
        const FileField& ff = view.fields[i];
        if (ff.field == nullptr) {
          // Absent: all null (but not for a dictionary column: see StatisticsGuarantee).
          if (!key_types_.count(names_[i]) &&
              view.schema->field(static_cast<int>(i))->type()->id() != arrow::Type::DICTIONARY) {
            known.push_back(cp::is_null(cp::field_ref(names_[i])));
          }
          continue;
        }
        // Nested (lists, structs, maps, even of one leaf): no statistics used. A leaf's
        // statistics are not the column's (a list of only [] or [null] has a leaf of
        // nulls but no null list).
        if (ff.leaves.size() != 1 || arrow::is_nested(ff.field->type()->id()) || ff.extension) {
          continue;
        }
        auto chunk = rg->ColumnChunk(ff.leaves[0]);
        if (chunk == nullptr || !chunk->is_stats_set()) continue;
        std::shared_ptr<parquet::Statistics> stats;
        try {
          stats = chunk->statistics();
        } catch (const std::exception&) {
          // Undecodable (a decimal's min of 0 bytes): no guarantee, the mask decides (it
          // refused the file, "corrupt statistics", naming no column; loading reads it).
          continue;
        }
        if (stats == nullptr) continue;
        auto guarantee = StatisticsGuarantee(*ff.field, view.schema->field(static_cast<int>(i))->type(),
                                             *stats, chunk->num_values());
        if (guarantee) known.push_back(std::move(*guarantee));
      }
    } catch (const std::exception& e) {
      return MakeError(ErrorKind::kInvalidData, "'", file.display, "', row group ",
                       split.row_group, ": corrupt statistics: ", e.what());
    }
    if (known.empty()) return expr;
    auto guarantee = cp::and_(known).Bind(*view.schema);
    if (!guarantee.ok()) return expr;  // statistics of a type the filter cannot use
    // The values the statistics fix (min == max, no null: an "equal") are put in first, as
    // Arrow's simplification puts them: where they make a NaN of the filter, "not (x <
    // sqrt(y))" over y = -1 throughout, it then orders that NaN above the other columns'
    // bounds ("x < NaN" over [1, 3] true) and pruned row groups whose rows pass. Such a
    // row group gets no statistics (HasNanLiteral; value sets: the view's check).
    std::vector<cp::Expression> fixed;
    for (const cp::Expression& k : known) {
      if (k.call() != nullptr && k.call()->function_name == "equal") fixed.push_back(k);
    }
    if (!fixed.empty()) {
      auto by_fixed = cp::and_(fixed).Bind(*view.schema);
      if (!by_fixed.ok()) return expr;
      auto replaced = cp::SimplifyWithGuarantee(expr, *by_fixed);
      if (!replaced.ok() || HasNanLiteral(*replaced, /*value_sets=*/false)) return expr;
    }
    auto simplified = cp::SimplifyWithGuarantee(expr, *guarantee);
    if (!simplified.ok()) return expr;
    return std::move(simplified).ValueUnsafe();
  }

  // What a column chunk's statistics guarantee, as Arrow's Parquet datasets read them.
  // `type`: the column's in the filter (its target, else the file's own).
  static std::optional<cp::Expression> StatisticsGuarantee(const arrow::Field& field,
                                                           const std::shared_ptr<arrow::DataType>& type,
                                                           const parquet::Statistics& stats,
                                                           int64_t chunk_values) {
    auto ref = cp::field_ref(field.name());
    // Dictionary columns (pandas categoricals): Arrow simplifies is_null/is_valid of a
    // dictionary field under "is_null" the wrong way round (all-null row groups were
    // kept whole by "s is not None" and pruned by "s is None"): no guarantee.
    if (field.type()->id() == arrow::Type::DICTIONARY) return std::nullopt;
    // Statistics that contradict themselves are a hostile or broken writer's and bound no
    // row: a null count outside the chunk's values is unknown, "all null" only holds
    // without a min and max (which only values have), and min > max (below) gives no
    // guarantee. Taken as they stood, they pruned row groups whose rows pass.
    const bool null_count_ok = stats.HasNullCount() && stats.null_count() >= 0 &&
                               stats.null_count() <= chunk_values;
    if (null_count_ok && stats.num_values() == 0 && stats.null_count() > 0 && !stats.HasMinMax()) {
      return cp::is_null(ref);
    }
    if (!stats.HasMinMax()) return std::nullopt;
    // A byte-array column without the file's column orders (writers before parquet-format
    // 2.4: parquet-mr before 1.10, Spark 2.x, old Impala) has its min and max from the
    // deprecated fields, ordered by signed comparison byte by byte; Parquet C++ takes them
    // in the column's order where that is "signed", a decimal's, which byte by byte it is
    // not (2.00, 0x..c8, sorts below 1.00, 0x..64: parquet-mr 1.8's min 2.00, max 24.00
    // over 1.00..24.00 pruned "value == 1.00" in parquet-testing's
    // fixed_length_decimal.parquet). Such bounds are used only where equal (every order
    // agrees then).
    if (const parquet::ColumnDescriptor* descr = stats.descr();
        descr != nullptr &&
        (descr->physical_type() == parquet::Type::BYTE_ARRAY ||
         descr->physical_type() == parquet::Type::FIXED_LEN_BYTE_ARRAY) &&
        descr->column_order().get_order() != parquet::ColumnOrder::TYPE_DEFINED_ORDER &&
        stats.EncodeMin() != stats.EncodeMax()) {
      return std::nullopt;
    }
    // Parquet's min and max of floating-point columns leave NaN out, so they bound no
    // row that is NaN: "x > 0" over [1, 2] and NaN rows would be taken as true for the
    // whole row group (its NaN rows kept), and its negation as false (pruned with them).
    if (arrow::is_floating(field.type()->id())) return std::nullopt;
    std::shared_ptr<arrow::Scalar> min, max;
    if (!parquet::arrow::StatisticsAsScalars(stats, &min, &max).ok()) return std::nullopt;
    // Checked (Scalar::CastTo wraps integers: a file's int64 5 .. 2^32 + 3 under a declared
    // int32 became 5 .. 3, and pruned a row group holding 7 for "x > 6"). An integer bound
    // a float does not hold exactly gives no guarantee: rounded (2^53 + 1 to 2^53), it
    // pruned a row group "x > 2^53" keeps, whose values the mask pass refuses as inexact
    // (as pyarrow does) where the statistics do not prune. The other bound still holds
    // (rounding keeps order), as pyarrow takes it: [-93, 2^63 - 1] prunes "x < -510".
    auto checked = [&](const std::shared_ptr<arrow::Scalar>& v) -> std::shared_ptr<arrow::Scalar> {
      if (v->type->Equals(*type)) return v;
      const bool to_float = arrow::is_integer(v->type->id()) && arrow::is_floating(type->id());
      cp::CastOptions options = cp::CastOptions::Safe();
      options.allow_float_truncate = to_float;
      auto cast = cp::Cast(arrow::Datum(v), type, options);
      if (!cast.ok() || !cast->is_scalar()) return nullptr;
      if (to_float) {
        auto back = cp::Cast(*cast, v->type, cp::CastOptions::Safe());
        if (!back.ok() || !back->is_scalar() || !back->scalar()->Equals(*v)) return nullptr;
      }
      return cast->scalar();
    };
    // (Both are checked against each other first, in the column's type: min > max gives
    // no guarantee, whichever bound the loaded type holds.)
    auto inverted = cp::CallFunction("greater", {arrow::Datum(min), arrow::Datum(max)});
    if (!inverted.ok() || !inverted->is_scalar() || !inverted->scalar()->is_valid ||
        static_cast<const arrow::BooleanScalar&>(*inverted->scalar()).value) {
      return std::nullopt;
    }
    min = checked(min);
    max = checked(max);
    if (min == nullptr && max == nullptr) return std::nullopt;
    cp::Expression in_range =
        min == nullptr   ? cp::less_equal(ref, cp::literal(max))
        : max == nullptr ? cp::greater_equal(ref, cp::literal(min))
        : min->Equals(*max) ? cp::equal(ref, cp::literal(min))
                            : cp::and_(cp::greater_equal(ref, cp::literal(min)),
                                       cp::less_equal(ref, cp::literal(max)));
    if (!null_count_ok || stats.null_count() != 0) {
      return cp::or_(std::move(in_range), cp::is_null(ref));
    }
    return in_range;
  }

  // The filter's (and the predicate's) columns of one row group.
  arrow::Status ReadColumns(const DataFile& file, const Split& split, const FileView& view,
                            const std::string& where,
                            std::map<std::string, std::shared_ptr<arrow::Array>>* out,
                            int64_t* bytes_read) {
    std::vector<int> leaves;
    for (const auto& ff : view.fields) leaves.insert(leaves.end(), ff.leaves.begin(), ff.leaves.end());
    std::sort(leaves.begin(), leaves.end());
    leaves.erase(std::unique(leaves.begin(), leaves.end()), leaves.end());
    std::shared_ptr<arrow::Table> table;
    const int64_t n = split.file_rows;
    if (!leaves.empty()) {
      ARROW_RETURN_NOT_OK(CheckFooterUnchanged(file));
      auto input = file.Open();
      if (!input.ok()) {
        return MakeIOError(input.status(), "cannot open ", where);
      }
      try {
        parquet::ReaderProperties reader_properties = parquet::default_reader_properties();
        reader_properties.set_page_checksum_verification(options_.verify_checksums);
        auto recorded = std::make_shared<ReadFailureRecorder>(*input);
        auto pq = parquet::ParquetFileReader::Open(recorded, reader_properties, file.Metadata());
        parquet::ArrowReaderProperties props = dataset_.ArrowProperties();
        props.set_use_threads(false);
        // Read on this thread, not Arrow's I/O pool: its RetryStopScope then ends a read
        // against a stalled store once Ctrl-C is pressed (util/cancel.h).
        props.set_pre_buffer(false);
        std::unique_ptr<parquet::arrow::FileReader> reader;
        auto made = parquet::arrow::FileReader::Make(arrow::default_memory_pool(), std::move(pq),
                                                     props);
        if (!made.ok()) return WithContext(made.status(), "cannot read " + where);
        reader = std::move(made).ValueUnsafe();
        // In bounded batches, stopping past the footer's row count: read in one piece, a
        // false count (2^31 rows in a 7 KB file) reserved memory for every claimed row.
        auto read = ReadRowGroupBounded(reader.get(), split.row_group, leaves, n);
        arrow::Status st = read.status();
        if (st.ok()) table = std::move(read).ValueUnsafe();
        if (st.IsOutOfMemory()) {  // (a malloc that failed, not the data: MemoryError)
          return WithContext(st, "cannot read the filter's columns of " + where);
        }
        if (!st.ok()) {
          // Storage only where a read of the file failed: corrupt pages, codecs' errors
          // and failed checksums come as IOErrors too.
          std::string columns;
          for (size_t i = 0; i < names_.size() && i < view.fields.size(); ++i) {
            if (view.fields[i].field == nullptr) continue;
            columns += (columns.empty() ? "" : ", ") + ("'" + names_[i] + "'");
          }
          return MakeError(st.IsIOError() && recorded->failed() ? ErrorKind::kIO
                                                                 : ErrorKind::kInvalidData,
                           "cannot read the filter's column",
                           columns.find(',') == std::string::npos ? " " : "s ", columns, " of ",
                           where, ": ", st.message());
        }
        auto rg = file.RowGroup(split.row_group);
        for (int leaf : leaves) {
          *bytes_read += rg->ColumnChunk(leaf)->total_compressed_size();
          // Arrow wraps INT96 dates outside int64 of their unit: every row is compared.
          if (file.schema()->Column(leaf)->physical_type() != parquet::Type::INT96) continue;
          ARROW_RETURN_NOT_OK(CheckInt96Rows(reader->parquet_reader(), split.row_group, leaf, 0,
                                             n, nullptr, dataset_.int96_unit(),
                                             "the filter's column '" +
                                             file.schema()->Column(leaf)->path()->ToDotString() +
                                             "' of " + where));
        }
      } catch (const std::bad_alloc&) {
        return arrow::Status::OutOfMemory("cannot read the filter's columns of ", where,
                                          ": out of memory");
      } catch (const std::exception& e) {
        return MakeError(ErrorKind::kInvalidData, "cannot read the filter's columns of ", where,
                         ": ", e.what());
      }
      if (table->num_rows() != n) {
        return MakeError(ErrorKind::kInvalidData, "cannot read the filter's columns of ", where,
                         ": read ", table->num_rows(), " rows, the footer says ", n);
      }
    }
    for (size_t i = 0; i < names_.size(); ++i) {
      const std::string& name = names_[i];
      const auto& type = view.schema->field(static_cast<int>(i))->type();
      std::shared_ptr<arrow::Array> array;
      if (view.fields[i].field != nullptr) {
        auto chunked = table->GetColumnByName(name);
        if (chunked == nullptr) {
          return MakeError(ErrorKind::kInvalidData, "cannot read column '", name, "' of ", where);
        }
        ARROW_ASSIGN_OR_RAISE(chunked, WithoutExtension(chunked, arrow::default_memory_pool()));
        ARROW_ASSIGN_OR_RAISE(array, ConcatenateFilterColumn(*chunked, name, where));
        if (target_.count(name) && !array->type()->Equals(*type)) {
          // The values the loader loads (FindTargets): cast exactly, as the batches are.
          // Integers to floats: every one the float holds exactly, as loading takes them
          // (decode/convert.cc); Arrow's safe cast refuses all past 2^53.
          const bool to_float = arrow::is_integer(ElementOf(*array->type()).id()) &&
                                arrow::is_floating(ElementOf(*type).id());
          cp::CastOptions options = cp::CastOptions::Safe();
          options.allow_float_truncate = to_float;
          auto cast = cp::Cast(*array, type, options);
          if (!cast.ok()) {
            return MakeError(ErrorKind::kInvalidData, "cannot filter ", where, ": column '", name,
                             "' (", array->type()->ToString(), ") does not convert to the ",
                             type->ToString(), " the filter compares: ", cast.status().message());
          }
          if (to_float) {
            auto back = cp::Cast(**cast, array->type(), cp::CastOptions::Safe());
            ARROW_RETURN_NOT_OK(CheckExact(*array, back, name, type, where));
          }
          array = std::move(cast).ValueUnsafe();
        }
      } else if (auto k = key_index_.find(name); k != key_index_.end()) {
        if (file.partition_null[k->second]) {
          ARROW_ASSIGN_OR_RAISE(array, arrow::MakeArrayOfNull(type, n));
        } else {
          std::shared_ptr<arrow::Scalar> value =
              type->id() == arrow::Type::INT64
                  ? arrow::MakeScalar(int64_t{std::stoll(file.partition_values[k->second])})
                  : arrow::MakeScalar(file.partition_values[k->second]);
          ARROW_ASSIGN_OR_RAISE(array, arrow::MakeArrayFromScalar(*value, n));
        }
      } else {
        ARROW_ASSIGN_OR_RAISE(array, arrow::MakeArrayOfNull(type, n));  // file lacks it
      }
      (*out)[name] = std::move(array);
    }
    return arrow::Status::OK();
  }

  // `back` (an integer column cast to a float and back) equals `read`, else name a value
  // the float does not hold, as loading the column refuses it.
  static arrow::Status CheckExact(const arrow::Array& read, const arrow::Result<std::shared_ptr<arrow::Array>>& back,
                                  const std::string& name, const std::shared_ptr<arrow::DataType>& type,
                                  const std::string& where) {
    if (back.ok() && (*back)->Equals(read)) return arrow::Status::OK();
    // The first value that does not come back (where the cast back failed as a whole, a
    // value past the integer type's range, each is cast alone: it named the first value).
    std::string value;
    cp::CastOptions to_float = cp::CastOptions::Safe();
    to_float.allow_float_truncate = true;
    for (int64_t r = 0; r < read.length() && value.empty(); ++r) {
      if (read.IsNull(r)) continue;
      auto mine = read.GetScalar(r);
      if (!mine.ok()) continue;
      bool exact = false;
      if (back.ok()) {
        auto theirs = (*back)->GetScalar(r);
        exact = theirs.ok() && (*mine)->Equals(**theirs);
      } else if (auto f = cp::Cast(arrow::Datum(*mine), type, to_float); f.ok()) {
        auto again = cp::Cast(*f, read.type(), cp::CastOptions::Safe());
        exact = again.ok() && again->is_scalar() && again->scalar()->Equals(**mine);
      }
      if (!exact) value = (*mine)->ToString();
    }
    return MakeError(ErrorKind::kSchemaMismatch, "cannot filter ", where, ": column '", name, "' holds ",
                     value.empty() ? std::string("an integer") : value, ", which ", type->ToString(),
                     " does not hold exactly (the loader loads the column as ", type->ToString(), ")");
  }

  static arrow::Status AndInto(const arrow::Datum& result, int64_t n, std::vector<uint8_t>* keep,
                               const std::string& where, const char* what) {
    if (result.is_scalar()) {
      const auto& s = *result.scalar();
      const bool pass = s.is_valid && s.type->id() == arrow::Type::BOOL &&
                        static_cast<const arrow::BooleanScalar&>(s).value;
      if (!pass) std::fill(keep->begin(), keep->end(), 0);
      return arrow::Status::OK();
    }
    if (!result.is_array() || result.type()->id() != arrow::Type::BOOL ||
        result.length() != n) {
      return arrow::Status::Invalid(what, " gave ",
                                    result.is_array() ? result.type()->ToString() : "no array",
                                    " of length ", result.length(), " for ", where, " (", n,
                                    " rows): it must give one bool per row");
    }
    arrow::BooleanArray mask(result.array());
    for (int64_t i = 0; i < n; ++i) {
      if (!mask.IsValid(i) || !mask.Value(i)) (*keep)[i] = 0;
    }
    return arrow::Status::OK();
  }

  const Dataset& dataset_;
  const FilterOptions& options_;
  cp::Expression expr_;
  std::vector<std::string> names_;
  std::map<std::string, std::shared_ptr<arrow::DataType>> key_types_, fallback_;
  // Numeric columns the filter sees in the type the loader loads (unified or declared),
  // not in each file's own: see FindTargets.
  std::map<std::string, std::shared_ptr<arrow::DataType>> target_;
  std::map<std::string, int> key_index_;
  Mutex mu_;
  // Per stored Arrow schema (the ARROW:schema value, "" without one), per distinct
  // Parquet schema: the manifest.
  std::map<std::string, std::vector<std::pair<const parquet::SchemaDescriptor*,
                                              std::shared_ptr<parquet::arrow::SchemaManifest>>>>
      manifests_ PQ_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<FileView>> views_ PQ_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<parquet::arrow::SchemaManifest>> manifest_of_ PQ_GUARDED_BY(mu_);
  std::map<std::string, cp::Expression> bound_ PQ_GUARDED_BY(mu_);
};

// --- the stored selection --------------------------------------------------------------

// 002: the store key follows the magic (a 001 selection copied over another key's file
// was served as that key's).
constexpr char kStoreMagic[8] = {'P', 'Q', 'S', 'E', 'L', '0', '0', '2'};

std::string StoreKey(const Dataset& dataset, const FilterOptions& options, const std::string& targets) {
  // v2: floating-point statistics and those of one-leaf nested columns no longer used
  // (v1 selections could keep NaN rows, or misjudge lists and structs). v3: none of
  // dictionary columns nor for filters with a NaN literal, INT96 dates range-checked
  // (v2 selections could be wrong there). v4: files that differ only in their stored
  // Arrow schema (string and large_string) filtered each with its own types (v3 read
  // them as the first such file's). v5: statistics only prune (v4 kept row groups they
  // showed wholly kept unread: statistics that lied kept rows that fail the filter). v6:
  // numeric columns compared in the loaded type (Evaluator::FindTargets, in the key with
  // `targets`), and the key holds how each partition key loads (int64 or text: schema=
  // decides, and "01" is another value as text; v5 served one's selection to the other).
  // v7: statistics cast to such a type with a range check (v6 wrapped a declared int32's:
  // row groups pruned whose rows pass). v8: statistics that contradict themselves (min >
  // max, all null beside a min and max, a null count past the chunk's values) give no
  // guarantee (v7 pruned by them). v9: strings, bytes and float16 in a layout Arrow's
  // kernels take (dictionary, fixed-size binary, view and float16 files were refused).
  // v10: lists of numbers in the loaded list type (v9 used each file's). v11: at any
  // list depth, float16 elements as float32. v12: an integer bound a float column does not
  // hold exactly prunes nothing (its row group is read, and refused). v13: a decimal
  // looked up in a set of floats prunes nothing. v14: the deprecated min and max of a
  // byte-array column (files without column orders: a decimal's, byte by byte, is not its
  // order) prune only where equal (v13 pruned row groups holding rows that pass). v15:
  // no statistics where the values partition keys or constant row groups (min == max)
  // give a column make a NaN (v14 pruned row groups whose rows pass), and the key holds
  // the unit INT96 timestamps are read in (v14 served a selection made in nanoseconds to
  // a read in microseconds, which truncates).
  // (The engine's serialization: pyarrow 14's bytes of an expression differ from 25's.)
  std::string id = "filter-v15|" + CanonicalExpression(options.serialized_expression);
  if (options.verify_checksums) id += "|crc=verified";
  id += "|int96=" + std::to_string(static_cast<int>(dataset.int96_unit()));
  id += targets;
  // The partition keys, and so each file's values, depend on the root the dataset was
  // opened at, not on its files: the same files under another root are another dataset.
  const auto& loads = dataset.key_loads();
  for (size_t k = 0; k < dataset.partition_keys().size(); ++k) {
    id.append("|key=").append(dataset.partition_keys()[k]);
    if (k < loads.size()) id.append(":").append(std::to_string(static_cast<int>(loads[k])));
  }
  for (const auto& f : dataset.files()) {
    id.append("|").append(f.display).append(":").append(std::to_string(f.size)).append(":");
    id.append(std::to_string(f.mtime_ns)).append(":").append(f.footer_hash);
    for (size_t k = 0; k < f.partition_values.size(); ++k) {
      id.append(f.partition_null[k] != 0 ? ":null" : ":=" + f.partition_values[k]);
    }
  }
  for (const auto& s : dataset.splits()) {
    id.append("|").append(std::to_string(s.file)).append(".").append(std::to_string(s.row_group));
  }
  return FooterHash(id);
}

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <typename T>
bool Take(const std::string& in, size_t* pos, T* v) {
  if (in.size() < *pos + sizeof(T)) return false;
  std::memcpy(v, in.data() + *pos, sizeof(T));
  *pos += sizeof(T);
  return true;
}

std::vector<int64_t*> StatFields(FilterStats* s) {
  return {&s->files, &s->files_pruned, &s->row_groups, &s->row_groups_pruned_partition,
          &s->row_groups_pruned_statistics, &s->row_groups_all_rows, &s->row_groups_masked,
          &s->row_groups_pruned_mask, &s->rows, &s->rows_kept, &s->bytes, &s->bytes_pruned,
          &s->mask_bytes_read};
}

std::string Serialize(RowSelection sel, const std::string& key) {
  std::string out(kStoreMagic, sizeof kStoreMagic);
  Put<int64_t>(&out, static_cast<int64_t>(key.size()));
  out += key;
  Put<int64_t>(&out, static_cast<int64_t>(sel.stage.size()));
  for (size_t i = 0; i < sel.stage.size(); ++i) {
    Put<uint8_t>(&out, static_cast<uint8_t>(sel.stage[i]));
    const auto& rows = sel.rows[i];
    Put<int64_t>(&out, rows ? static_cast<int64_t>(rows->size()) : 0);
    if (rows) out.append(reinterpret_cast<const char*>(rows->data()), rows->size() * 4);
  }
  for (int64_t* v : StatFields(&sel.stats)) Put<int64_t>(&out, *v);
  out += FooterHash(out);
  return out;
}

std::optional<RowSelection> Deserialize(const std::string& in, const Dataset& dataset,
                                        const std::string& key) {
  constexpr size_t kHash = 32;
  if (in.size() < sizeof kStoreMagic + kHash ||
      std::memcmp(in.data(), kStoreMagic, sizeof kStoreMagic) != 0 ||
      FooterHash(in.substr(0, in.size() - kHash)) != in.substr(in.size() - kHash)) {
    return std::nullopt;
  }
  const std::string body = in.substr(0, in.size() - kHash);
  size_t pos = sizeof kStoreMagic;
  int64_t key_size = 0;
  if (!Take(body, &pos, &key_size) || key_size != static_cast<int64_t>(key.size()) ||
      body.compare(pos, key.size(), key) != 0) {
    return std::nullopt;  // another key's selection (a file copied over this one)
  }
  pos += key.size();
  int64_t n = 0;
  if (!Take(body, &pos, &n) || n != static_cast<int64_t>(dataset.splits().size())) {
    return std::nullopt;
  }
  RowSelection sel;
  sel.stage.resize(n);
  sel.rows.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    uint8_t stage = 0;
    int64_t count = 0;
    if (!Take(body, &pos, &stage) || stage > 4 || !Take(body, &pos, &count) || count < 0 ||
        count > dataset.splits()[i].file_rows || body.size() < pos + count * 4) {
      return std::nullopt;
    }
    sel.stage[i] = static_cast<RowSelection::Stage>(stage);
    if (sel.stage[i] == RowSelection::Stage::kMasked) {
      auto rows = std::make_shared<std::vector<int32_t>>(count);
      std::memcpy(rows->data(), body.data() + pos, count * 4);
      sel.rows[i] = std::move(rows);
    }
    pos += count * 4;
  }
  for (int64_t* v : StatFields(&sel.stats)) {
    if (!Take(body, &pos, v)) return std::nullopt;
  }
  return sel;
}

std::string StorePath(const std::string& dir, const std::string& key) {
  return (std::filesystem::path(dir) / "filters" / (key + ".sel")).string();
}

std::optional<RowSelection> LoadStored(const std::string& path, const Dataset& dataset,
                                       const std::string& key) {
  // Not a blocking std::ifstream: a FIFO in place of a selection hung the loader. At most
  // the size of a selection of this dataset (Serialize's layout): one grown past it (a
  // sparse tail, another program's file) was read whole, and copied twice by Deserialize.
  FilterStats unused;
  int64_t max_bytes = static_cast<int64_t>(sizeof kStoreMagic) + 8 +
                      static_cast<int64_t>(key.size()) + 8 +
                      static_cast<int64_t>(StatFields(&unused).size()) * 8 + 32;
  for (const Split& s : dataset.splits()) max_bytes += 1 + 8 + 4 * s.file_rows;
  std::string bytes;
  if (!ReadCacheFile(path, max_bytes, &bytes)) return std::nullopt;
  return Deserialize(bytes, dataset, key);
}

// Deletes the selections' temp files left by writers killed mid-write ("<key>.sel.tmp-
// <pid>-<thread>" not written to for ten minutes, as a shard's temp files are swept):
// never read, they stayed until a `pqloader cache clear` (one of 4 bytes per kept row
// each), outside cache_size_limit.
void SweepSelectionTemps(const std::string& dir) {
  SweepStaleTemps(dir, [](const std::string& name) { return name.find(".sel.tmp-") == 32; });
}

// Save `sel` at `path`; return why it could not be (empty if it was): not kept, the next
// run evaluates again.
std::string Store(const std::string& path, const RowSelection& sel, const std::string& key) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string failed = "cannot save the filter's selection as '" + path + "' (";
  const std::string unsaved = "): the next run evaluates the filter again";
  if (ec) return failed + ec.message() + unsaved;
  SweepSelectionTemps(std::filesystem::path(path).parent_path().string());
  const std::string why = WriteCacheFile(path, Serialize(sel, key));  // "<key>.sel.tmp-..." first
  return why.empty() ? "" : failed + why + unsaved;
}

}  // namespace

arrow::Result<std::shared_ptr<arrow::Array>> ConcatenateFilterColumn(
    const arrow::ChunkedArray& chunked, const std::string& column, const std::string& where,
    int64_t max_offset) {
  // A row group of no rows: no batch was read.
  if (chunked.num_chunks() == 0) return arrow::MakeEmptyArray(chunked.type());
  const arrow::Type::type id = chunked.type()->id();
  const bool bytes = id == arrow::Type::STRING || id == arrow::Type::BINARY;
  if (bytes || id == arrow::Type::LIST || id == arrow::Type::MAP) {
    int64_t total = 0;  // what the chunks' offsets index, together
    for (const auto& chunk : chunked.chunks()) {
      const int64_t n = chunk->length();
      if (n == 0) continue;
      const auto* off = chunk->data()->GetValues<int32_t>(1);  // (from the chunk's offset)
      total += int64_t{off[n]} - off[0];
    }
    if (total > max_offset) {
      return MakeError(ErrorKind::kInvalidData, "cannot filter ", where, ": column '", column,
                       "' holds ", total, bytes ? " bytes" : " values",
                       " in this row group, more than the 32-bit offsets of its type (",
                       chunked.type()->ToString(), ") index (", max_offset,
                       "), and a filter reads a row group's values as one array; write the "
                       "column as ", bytes ? "large_string or large_binary" : "large_list",
                       ", or the file in smaller row groups");
    }
  }
  auto joined = arrow::Concatenate(chunked.chunks());
  if (joined.ok()) return joined;
  const std::string context = "cannot filter " + where + ": column '" + column + "'";
  if (joined.status().IsOutOfMemory()) return WithContext(joined.status(), context);
  return MakeError(ErrorKind::kInvalidData, context, ": ", joined.status().message());
}

arrow::Result<RowSelection> EvaluateFilter(const Dataset& dataset, const FilterOptions& options) {
  // Not of a dataset with an object modified just before it was listed (DataFile::
  // settled): a replacement within its second could share the store's key.
  const bool storable = !options.store_dir.empty() && options.predicate == nullptr &&
                        !options.serialized_expression.empty() &&
                        std::all_of(dataset.files().begin(), dataset.files().end(),
                                    [](const DataFile& f) { return f.settled; });
  std::string store_key, store_path;
  std::unique_ptr<NodeLock> node_lock;
  Evaluator evaluator(dataset, options);
  ARROW_RETURN_NOT_OK(evaluator.Prepare());
  if (storable) {
    store_key = StoreKey(dataset, options, evaluator.TargetsText());
    store_path = StorePath(options.store_dir, store_key);
    // One rank of a node computes the selection; the others wait and load it.
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (auto stored = LoadStored(store_path, dataset, store_key)) {
        stored->stats.from_store = true;
        stored->stats.mask_bytes_read = 0;  // no mask pass ran now (the stored one's count)
        return std::move(*stored);
      }
      if (attempt == 0) {
        // Marked before filters/ is made (as the cache's shards are): a process killed in
        // between left a directory `pqloader cache stats`, `clear` and `prune` refused.
        std::error_code mark_ec;
        std::filesystem::create_directories(options.store_dir, mark_ec);
        if (!mark_ec) MarkCacheDir(options.store_dir);
        node_lock = NodeLock::AcquireToStore(
            (std::filesystem::path(options.store_dir) / "filters" / ".lock").string(),
            std::chrono::minutes(30), options.cancel);
        if (IsCancelled(options.cancel)) return CancelledStatus();
      }
    }
  }
  const auto& splits = dataset.splits();
  RowSelection sel;
  sel.stage.assign(splits.size(), RowSelection::Stage::kAll);
  sel.rows.resize(splits.size());
  std::vector<std::vector<int64_t>> by_file(dataset.files().size());
  for (size_t s = 0; s < splits.size(); ++s) by_file[splits[s].file].push_back(s);
  const int threads = options.threads > 0 ? options.threads : AvailableCpus();
  // Stages 1 and 2 (footers only), in parallel over files.
  std::vector<std::vector<std::pair<int64_t, cp::Expression>>> masks(by_file.size());
  ARROW_RETURN_NOT_OK(ParallelForStatus(static_cast<int64_t>(by_file.size()), threads, [&](int64_t f) {
    const RetryStopScope no_retry_once_cancelled(options.cancel);
    if (IsCancelled(options.cancel)) return CancelledStatus();
    if (by_file[f].empty()) return arrow::Status::OK();
    return evaluator.PruneFile(static_cast<size_t>(f), by_file[f], &sel, &masks[f]);
  }));
  std::vector<std::pair<int64_t, cp::Expression>> to_mask;
  for (auto& m : masks) {
    for (auto& e : m) to_mask.push_back(std::move(e));
  }
  // Stage 3: row masks, in parallel over row groups.
  std::atomic<int64_t> mask_bytes{0};
  ARROW_RETURN_NOT_OK(ParallelForStatus(static_cast<int64_t>(to_mask.size()), threads, [&](int64_t i) {
    const RetryStopScope no_retry_once_cancelled(options.cancel);
    if (IsCancelled(options.cancel)) return CancelledStatus();
    int64_t bytes = 0;
    const int64_t s = to_mask[i].first;
    auto rows = evaluator.Mask(s, to_mask[i].second, &bytes);
    mask_bytes += bytes;
    if (!rows.ok()) return rows.status();
    if (*rows == nullptr) {
      sel.stage[s] = RowSelection::Stage::kMask;
    } else if (static_cast<int64_t>((*rows)->size()) == splits[s].file_rows) {
      sel.stage[s] = RowSelection::Stage::kAll;
    } else {
      sel.stage[s] = RowSelection::Stage::kMasked;
      sel.rows[s] = std::move(rows).ValueUnsafe();
    }
    return arrow::Status::OK();
  }));
  FilterStats& st = sel.stats;
  st.files = static_cast<int64_t>(dataset.files().size());
  st.row_groups = static_cast<int64_t>(splits.size());
  st.row_groups_masked = static_cast<int64_t>(to_mask.size());
  st.mask_bytes_read = mask_bytes;
  for (size_t f = 0; f < by_file.size(); ++f) {
    bool pruned = !by_file[f].empty();
    for (int64_t s : by_file[f]) pruned = pruned && sel.stage[s] == RowSelection::Stage::kPartition;
    st.files_pruned += pruned ? 1 : 0;
  }
  for (size_t s = 0; s < splits.size(); ++s) {
    st.rows += splits[s].file_rows;
    st.bytes += splits[s].compressed_bytes;
    switch (sel.stage[s]) {
      case RowSelection::Stage::kAll:
        st.rows_kept += splits[s].file_rows;
        st.row_groups_all_rows += 1;
        break;
      case RowSelection::Stage::kMasked:
        st.rows_kept += static_cast<int64_t>(sel.rows[s]->size());
        break;
      case RowSelection::Stage::kPartition:
        st.row_groups_pruned_partition += 1;
        st.bytes_pruned += splits[s].compressed_bytes;
        break;
      case RowSelection::Stage::kStatistics:
        st.row_groups_pruned_statistics += 1;
        st.bytes_pruned += splits[s].compressed_bytes;
        break;
      case RowSelection::Stage::kMask:
        st.row_groups_pruned_mask += 1;
        st.bytes_pruned += splits[s].compressed_bytes;
        break;
    }
  }
  // Kept whole after a mask pass counts as masked, not as decided by statistics.
  for (const auto& [s, e] : to_mask) {
    if (sel.stage[s] == RowSelection::Stage::kAll) st.row_groups_all_rows -= 1;
  }
  if (storable) sel.stats.store_error = Store(store_path, sel, store_key);
  return sel;
}

void ApplySelection(const RowSelection& selection, Dataset* dataset) {
  std::vector<Split> kept;
  const auto& splits = dataset->splits();
  for (size_t s = 0; s < splits.size(); ++s) {
    Split split = splits[s];
    switch (selection.stage[s]) {
      case RowSelection::Stage::kAll:
        kept.push_back(split);
        break;
      case RowSelection::Stage::kMasked:
        split.rows = selection.rows[s];
        split.num_rows = static_cast<int64_t>(split.rows->size());
        kept.push_back(split);
        break;
      default:
        break;
    }
  }
  dataset->RestrictSplits(std::move(kept));
}

std::string SelectionFingerprint(const Split& split) {
  if (split.rows == nullptr) return "";
  return FooterHash(std::string(reinterpret_cast<const char*>(split.rows->data()),
                                split.rows->size() * sizeof(int32_t)));
}

std::string CanonicalExpression(const std::string& serialized_expression) {
  auto expr = ReadExpression(serialized_expression);
  if (!expr.ok()) return serialized_expression;
  auto buffer = cp::Serialize(*expr);
  return buffer.ok() ? (*buffer)->ToString() : serialized_expression;
}

namespace {

// `e` with the value set of every is_in (at any depth) sorted and without duplicates.
arrow::Result<cp::Expression> SortIsInSets(const cp::Expression& e) {
  const cp::Expression::Call* call = e.call();
  if (call == nullptr) return e;
  std::vector<cp::Expression> args;
  args.reserve(call->arguments.size());
  for (const auto& a : call->arguments) {
    ARROW_ASSIGN_OR_RAISE(auto sorted, SortIsInSets(a));
    args.push_back(std::move(sorted));
  }
  std::shared_ptr<cp::FunctionOptions> options = call->options;
  const auto* lookup = dynamic_cast<const cp::SetLookupOptions*>(options.get());
  if (call->function_name == "is_in" && lookup != nullptr && lookup->value_set.is_array()) {
    ARROW_ASSIGN_OR_RAISE(auto unique, cp::Unique(lookup->value_set));
    ARROW_ASSIGN_OR_RAISE(auto order, cp::SortIndices(*unique));
    ARROW_ASSIGN_OR_RAISE(auto sorted, cp::Take(unique, order));
    auto copy = std::make_shared<cp::SetLookupOptions>(*lookup);
    copy->value_set = std::move(sorted);
    options = std::move(copy);
  }
  return cp::call(call->function_name, std::move(args), std::move(options));
}

}  // namespace

std::string SortedValueSets(const std::string& serialized_expression) {
  auto expr = ReadExpression(serialized_expression);
  if (!expr.ok()) return serialized_expression;  // (refused, naming why, where it is read)
  auto sorted = SortIsInSets(*expr);
  if (!sorted.ok()) return serialized_expression;  // (a type SortIndices lacks: as given)
  auto buffer = cp::Serialize(*sorted);
  return buffer.ok() ? (*buffer)->ToString() : serialized_expression;
}

std::string DescribeExpression(const std::string& serialized_expression) {
  auto expr = ReadExpression(serialized_expression);
  return expr.ok() ? expr->ToString() : "";
}

namespace {

void AddIfAmbiguous(const arrow::Datum& value, std::set<std::string>* out) {
  const std::shared_ptr<arrow::DataType> type = value.type();
  if (type == nullptr) return;
  switch (type->id()) {
    case arrow::Type::HALF_FLOAT:
    case arrow::Type::FLOAT:
    case arrow::Type::BINARY:
    case arrow::Type::LARGE_BINARY:
    case arrow::Type::BINARY_VIEW:
    case arrow::Type::FIXED_SIZE_BINARY:
    case arrow::Type::INT8:
    case arrow::Type::INT16:
    case arrow::Type::INT32:
    case arrow::Type::UINT8:
    case arrow::Type::UINT16:
    case arrow::Type::UINT32:
      out->insert(type->ToString());
      return;
    case arrow::Type::UINT64:  // below 2^63, an int64 prints alike
      if (value.is_scalar() && value.scalar()->is_valid &&
          static_cast<const arrow::UInt64Scalar&>(*value.scalar()).value < (uint64_t{1} << 63)) {
        out->insert(type->ToString());
      }
      return;
    case arrow::Type::DURATION:  // printed as its count, the unit left out
      out->insert(type->ToString());
      return;
    case arrow::Type::DATE64: {  // printed as its day, a time of day left out
      if (!value.is_scalar() || !value.scalar()->is_valid) return;
      if (static_cast<const arrow::Date64Scalar&>(*value.scalar()).value % 86400000 != 0) {
        out->insert(type->ToString());
      }
      return;
    }
    case arrow::Type::DOUBLE: {  // a finite whole one prints as that integer
      if (!value.is_scalar() || !value.scalar()->is_valid) return;
      const double v = static_cast<const arrow::DoubleScalar&>(*value.scalar()).value;
      if (std::isfinite(v) && v == std::trunc(v)) out->insert(type->ToString());
      return;
    }
    default:
      return;
  }
}

void CollectAmbiguousLiterals(const cp::Expression& e, std::set<std::string>* out) {
  if (const arrow::Datum* literal = e.literal()) {
    AddIfAmbiguous(*literal, out);
    return;
  }
  const cp::Expression::Call* call = e.call();
  if (call == nullptr) return;
  // (is_in's value set is an option, printed with its type: "value_set=float:[...]")
  for (const cp::Expression& argument : call->arguments) CollectAmbiguousLiterals(argument, out);
}

}  // namespace

bool ValueSetPrintsAmbiguously(const std::string& serialized_expression) {
  auto expr = ReadExpression(serialized_expression);
  if (!expr.ok()) return false;
  std::vector<const cp::Expression*> todo{&*expr};
  while (!todo.empty()) {
    const cp::Expression::Call* call = todo.back()->call();
    todo.pop_back();
    if (call == nullptr) continue;
    for (const cp::Expression& argument : call->arguments) todo.push_back(&argument);
    const auto* lookup = dynamic_cast<const cp::SetLookupOptions*>(call->options.get());
    if (lookup == nullptr || !lookup->value_set.is_array()) continue;
    const std::shared_ptr<arrow::Array> values = lookup->value_set.make_array();
    if (!arrow::is_base_binary_like(values->type_id())) continue;  // (strings and binaries)
    for (int64_t i = 0; i < values->length(); ++i) {
      if (values->IsNull(i)) continue;
      const std::string_view v =
          values->type_id() == arrow::Type::LARGE_STRING || values->type_id() == arrow::Type::LARGE_BINARY
              ? static_cast<const arrow::LargeBinaryArray&>(*values).GetView(i)
              : static_cast<const arrow::BinaryArray&>(*values).GetView(i);
      if (v.find_first_of("\"\n\r\\") != std::string_view::npos) return true;
    }
  }
  return false;
}

std::string AmbiguousLiteralTypes(const std::string& serialized_expression) {
  auto expr = ReadExpression(serialized_expression);
  if (!expr.ok()) return "";
  std::set<std::string> types;
  CollectAmbiguousLiterals(*expr, &types);
  std::string out;
  for (const std::string& t : types) out += (out.empty() ? "" : ",") + t;
  return out;
}

}  // namespace pqloader
