// nanobind glue: argument conversion, GIL release around engine work, error mapping.
// Nothing per-row happens here except building Python str/bytes objects for string
// columns, which needs the GIL by nature.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

// NumPy's C API (TensorToNumpy), from the headers of NumPy 2 (built for NumPy >= 1.23 by
// default, pyproject.toml's dependency is >= 1.26); imported in the module's init.
#define NPY_NO_DEPRECATED_API NPY_1_23_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL pqloader_ARRAY_API
#include <numpy/arrayobject.h>

#include <arrow/c/abi.h>
#include <arrow/c/bridge.h>

#include <algorithm>
#include <limits>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>

#include <unistd.h>

#include <arrow/io/memory.h>
#include <arrow/ipc/dictionary.h>
#include <arrow/ipc/reader.h>
#include <arrow/ipc/writer.h>

#include "pqloader/api.h"
#include "pqloader/cache/footer_cache.h"
#include "pqloader/mix/mix_draws.h"
#include "pqloader/mix/mix_stream.h"
#include "pqloader/tensor/buffer_pool.h"
#include "pqloader/pack/document_lengths.h"
#include "pqloader/transform/op.h"
#include "pqloader/transform/pipeline.h"
#include "pqloader/util/container_limits.h"
#include "pqloader/util/fork_gate.h"

#include "gil.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace pqloader {
namespace {

// A failed arrow::Status on its way to becoming a Python exception.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const arrow::Status& status)
      : std::runtime_error(status.message()), status_(status) {}
  const arrow::Status& status() const { return status_; }

 private:
  arrow::Status status_;
};

void Check(const arrow::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T Check(arrow::Result<T> result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).ValueUnsafe();
}

// The exception classes of pqloader._errors, looked up once.
nb::handle ErrorClass(const char* name) {
  nb::object errors = nb::module_::import_("pqloader._errors");
  nb::object cls = errors.attr(name);
  return cls.release();  // kept for the life of the process
}

// The prefix of the status of a predicate that raised KeyboardInterrupt or SystemExit
// (see ToPredicate), then "#<id> ": RaisePython raises the very exception kept under that
// id (its SystemExit code as sys.exit got it: any object).
constexpr const char* kPredicateInterrupted = "the filter's predicate was interrupted: ";

// Those exceptions, kept from the predicate's thread until the engine's Cancelled status
// reaches RaisePython. Touched with the GIL held only; never destroyed (a static holding
// Python objects would release them after the interpreter is gone). An entry whose
// status never reaches Python (another thread's error came first) is a leaked reference.
struct PendingExceptions {
  std::map<uint64_t, PyObject*> kept;
  uint64_t next = 0;
};
PendingExceptions& Pending() {
  static auto* pending = new PendingExceptions();
  return *pending;
}

void RaisePython(const StatusError& e) {
  static const nb::handle kNotFound = ErrorClass("DataNotFoundError");
  static const nb::handle kInvalid = ErrorClass("InvalidDataError");
  static const nb::handle kMismatch = ErrorClass("SchemaMismatchError");
  static const nb::handle kUnsupported = ErrorClass("UnsupportedTypeError");
  static const nb::handle kColumn = ErrorClass("ColumnNotFoundError");
  static const nb::handle kIO = ErrorClass("IOError");
  static const nb::handle kBase = ErrorClass("Error");
  const arrow::Status& st = e.status();
  if (st.IsCancelled() && st.message().rfind(kPredicateInterrupted, 0) == 0) {
    // "#<id> <type>: <message>" (ToPredicate).
    const std::string rest = st.message().substr(std::strlen(kPredicateInterrupted));
    const uint64_t id = rest.size() > 1 && rest[0] == '#' ? std::strtoull(rest.c_str() + 1, nullptr, 10) : 0;
    auto& kept = Pending().kept;
    auto it = kept.find(id);
    if (it != kept.end()) {
      PyObject* exc = it->second;
      kept.erase(it);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
      Py_DECREF(exc);
    } else {  // raised already (the same status twice): its type, without its code
      PyErr_SetString(rest.find(" SystemExit:") != std::string::npos ? PyExc_SystemExit
                                                                     : PyExc_KeyboardInterrupt,
                      rest.c_str());
    }
    return;
  }
  nb::handle cls = kBase;
  if (const ErrorDetail* d = GetErrorDetail(st)) {
    switch (d->kind()) {
      case ErrorKind::kNotFound: cls = kNotFound; break;
      case ErrorKind::kInvalidData: cls = kInvalid; break;
      case ErrorKind::kSchemaMismatch: cls = kMismatch; break;
      case ErrorKind::kUnsupportedType: cls = kUnsupported; break;
      case ErrorKind::kColumnNotFound: cls = kColumn; break;
      case ErrorKind::kIO: cls = kIO; break;
    }
  } else if (st.IsIOError()) {
    cls = kIO;
  } else if (st.IsInvalid()) {
    cls = kInvalid;
  } else if (st.IsTypeError() || st.IsNotImplemented()) {
    cls = kUnsupported;
  } else if (st.IsKeyError()) {
    cls = kColumn;
  } else if (st.IsOutOfMemory()) {
    cls = PyExc_MemoryError;
  }
  // Messages quote data (values, headers, names) that need not be UTF-8: never let that
  // turn the error into a UnicodeDecodeError.
  const std::string text = OneLine(st.message());
  PyObject* message = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()),
                                           "backslashreplace");
  if (message == nullptr) {
    PyErr_Clear();
    message = PyUnicode_FromString("(unprintable error message)");
  }
  const ErrorDetail* detail = GetErrorDetail(st);
  if (detail != nullptr && detail->os_error() > 0 && (cls.is(kIO) || cls.is(kNotFound))) {
    // A storage error from the OS: the exception's errno (an OSError's), its str the
    // message (errno alone, without strerror, leaves OSError's str as it is).
    PyObject* exc = PyObject_CallOneArg(cls.ptr(), message);
    Py_XDECREF(message);
    if (exc == nullptr) return;  // the error of the call is set
    PyObject* number = PyLong_FromLong(detail->os_error());
    if (number == nullptr || PyObject_SetAttrString(exc, "errno", number) != 0) PyErr_Clear();
    Py_XDECREF(number);
    PyErr_SetObject(cls.ptr(), exc);
    Py_DECREF(exc);
    return;
  }
  PyErr_SetObject(cls.ptr(), message);
  Py_XDECREF(message);
}

// Text from the engine (a column name, an Arrow type, a path) as str, whatever its bytes:
// invalid UTF-8 is backslash-escaped.
nb::str Text(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()),
                                     "backslashreplace");
  if (o == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(o);
}

NullFill ToFill(nb::handle value) {
  NullFill fill;
  fill.enabled = true;
  if (nb::isinstance<nb::bool_>(value) || nb::isinstance<nb::int_>(value)) {
    fill.int_value = nb::cast<int64_t>(value);
  } else if (nb::isinstance<nb::float_>(value)) {
    fill.is_float = true;
    fill.float_value = nb::cast<double>(value);
  } else if (nb::isinstance<nb::str>(value)) {
    fill.bytes_value = nb::cast<std::string>(value);
    fill.is_bytes = true;
  } else if (nb::isinstance<nb::bytes>(value)) {
    nb::bytes b = nb::borrow<nb::bytes>(value);
    fill.bytes_value.assign(b.c_str(), b.size());
    fill.is_bytes = true;
  } else {
    throw nb::type_error("fill_null values must be int, float, str or bytes");
  }
  return fill;
}

template <typename T>
T Get(const nb::dict& d, const char* key, T fallback) {
  if (!d.contains(key) || d[key].is_none()) return fallback;
  return nb::cast<T>(d[key]);
}

// An op given as (name, {param: number | [numbers] | str}).
std::shared_ptr<const Op> ToOp(nb::handle op) {
  auto spec = nb::borrow<nb::tuple>(op);
  OpParams params;
  for (auto [k, v] : nb::borrow<nb::dict>(spec[1])) {
    const std::string key = nb::cast<std::string>(k);
    if (nb::isinstance<nb::str>(v)) {
      params.strings[key] = nb::cast<std::string>(v);
    } else if (nb::isinstance<nb::list>(v) || nb::isinstance<nb::tuple>(v)) {
      params.lists[key] = nb::cast<std::vector<double>>(v);
    } else {
      params.numbers[key] = nb::cast<double>(v);
    }
  }
  return Check(MakeOp(nb::cast<std::string>(spec[0]), params));
}

// A Python predicate (pqloader._filter.call_predicate's wrapper) as a BatchPredicate:
// it is called from the mask pass's threads, each taking the GIL for the call; the
// batch crosses by the Arrow C data interface (no copy), the result comes back so too.
BatchPredicate ToPredicate(nb::handle callable) {
  std::shared_ptr<nb::object> fn(new nb::object(nb::borrow(callable)), [](nb::object* p) {
    ScopedAcquire gil;  // the last copy may go on a thread without the GIL
    if (!gil.ok()) (void)p->release();  // the interpreter is exiting: leaked, not touched
    delete p;
  });
  return [fn](const std::shared_ptr<arrow::RecordBatch>& batch)
             -> arrow::Result<std::shared_ptr<arrow::Array>> {
    auto c_schema = std::make_unique<struct ArrowSchema>();
    auto c_array = std::make_unique<struct ArrowArray>();
    ARROW_RETURN_NOT_OK(arrow::ExportRecordBatch(*batch, c_array.get(), c_schema.get()));
    ScopedAcquire gil;
    if (!gil.ok()) return arrow::Status::Cancelled("the Python interpreter is exiting");
    try {
      nb::capsule schema(c_schema.release(), "arrow_schema", [](void* p) noexcept {
        auto* s = static_cast<struct ArrowSchema*>(p);
        if (s->release != nullptr) s->release(s);
        delete s;
      });
      nb::capsule array(c_array.release(), "arrow_array", [](void* p) noexcept {
        auto* a = static_cast<struct ArrowArray*>(p);
        if (a->release != nullptr) a->release(a);
        delete a;
      });
      nb::tuple result = nb::cast<nb::tuple>((*fn)(schema, array));
      auto* rs = static_cast<struct ArrowSchema*>(PyCapsule_GetPointer(result[0].ptr(), "arrow_schema"));
      auto* ra = static_cast<struct ArrowArray*>(PyCapsule_GetPointer(result[1].ptr(), "arrow_array"));
      if (rs == nullptr || ra == nullptr) throw nb::python_error();
      return arrow::ImportArray(ra, rs);
    } catch (nb::python_error& e) {
      // Type and message, not the traceback (which shows the engine's frames); a message
      // that cannot be made (str() raising, text that is not UTF-8) is left out.
      std::string type = "exception", message;
      try {
        type = nb::cast<std::string>(e.type().attr("__name__"));
        message = nb::cast<std::string>(nb::str(e.value()));
      } catch (...) {
        PyErr_Clear();
      }
      if (PyErr_GivenExceptionMatches(e.type().ptr(), PyExc_KeyboardInterrupt) ||
          PyErr_GivenExceptionMatches(e.type().ptr(), PyExc_SystemExit)) {
        // KeyboardInterrupt (Ctrl-C while the predicate ran), SystemExit: raised as
        // themselves once the mask pass returns (RaisePython), not as a pqloader.Error
        // that `except Exception` would swallow; the exception object itself is kept
        // (a SystemExit's code may be any object).
        PendingExceptions& pending = Pending();
        const uint64_t id = ++pending.next;
        PyObject* exc = e.value().ptr();
        Py_INCREF(exc);
        pending.kept[id] = exc;
        return arrow::Status::Cancelled(kPredicateInterrupted, "#", id, " ", type, ": ", message);
      }
      return arrow::Status::ExecutionError("the filter's predicate raised ", type, ": ", message);
    } catch (const std::exception& e) {
      return arrow::Status::ExecutionError("the filter's predicate failed: ", e.what());
    }
  };
}

// INT96 timestamps' unit from its Python name: "ns" (default), "us", "ms" or "s"
// (checked in Python).
arrow::TimeUnit::type Int96Unit(const std::string& unit) {
  return unit == "us"   ? arrow::TimeUnit::MICRO
         : unit == "ms" ? arrow::TimeUnit::MILLI
         : unit == "s"  ? arrow::TimeUnit::SECOND
                        : arrow::TimeUnit::NANO;
}

LoaderOptions ToOptions(const nb::dict& d) {
  LoaderOptions o;
  // filter: an expression as arrow::compute::Serialize bytes; predicate: (columns, call).
  if (d.contains("filter") && !d["filter"].is_none()) {
    nb::bytes b = nb::cast<nb::bytes>(d["filter"]);
    // (is_in sets sorted: the fingerprint, the state and the kept selection are then the
    // same in every process whatever order a Python set of strings gave them)
    o.filter.serialized_expression = pqloader::SortedValueSets(std::string(b.c_str(), b.size()));
  }
  if (d.contains("predicate") && !d["predicate"].is_none()) {
    nb::tuple p = nb::cast<nb::tuple>(d["predicate"]);
    o.filter.predicate_columns = nb::cast<std::vector<std::string>>(p[0]);
    o.filter.predicate = ToPredicate(p[1]);
  }
  if (d.contains("columns") && !d["columns"].is_none()) {
    o.dataset.columns.columns = nb::cast<std::vector<std::string>>(d["columns"]);
  }
  // null_mask: True (every column that can hold nulls) or a list of column names.
  if (d.contains("null_mask") && !d["null_mask"].is_none()) {
    if (nb::isinstance<nb::bool_>(d["null_mask"])) {
      o.dataset.columns.null_mask_all = nb::cast<bool>(d["null_mask"]);
    } else {
      o.dataset.columns.null_mask_columns = nb::cast<std::vector<std::string>>(d["null_mask"]);
    }
  }
  o.dataset.columns.spec.decimals_as_int64 = Get<std::string>(d, "decimals", "float64") == "int64";
  o.dataset.int96_unit = Int96Unit(Get<std::string>(d, "int96_unit", "ns"));
  // schema: a declared schema as Arrow IPC bytes (pyarrow.Schema.serialize()).
  if (d.contains("schema") && !d["schema"].is_none()) {
    nb::bytes b = nb::cast<nb::bytes>(d["schema"]);
    auto buffer = arrow::Buffer::FromString(std::string(b.c_str(), b.size()));
    arrow::io::BufferReader reader(buffer);
    arrow::ipc::DictionaryMemo memo;
    o.dataset.columns.schema = Check(arrow::ipc::ReadSchema(&reader, &memo));
  }
  o.plan.batch_size = Get<int64_t>(d, "batch_size", o.plan.batch_size);
  o.plan.drop_last = Get<bool>(d, "drop_last", o.plan.drop_last);
  o.plan.shuffle = Get<bool>(d, "shuffle", o.plan.shuffle);
  o.plan.seed = Get<uint64_t>(d, "seed", o.plan.seed);
  o.plan.shuffle_window = Get<int64_t>(d, "shuffle_window", o.plan.shuffle_window);
  o.plan.rank = Get<int64_t>(d, "rank", o.plan.rank);
  o.plan.world_size = Get<int64_t>(d, "world_size", o.plan.world_size);
  const std::string policy = Get<std::string>(d, "shard_policy", "drop");
  o.plan.shard_policy = policy == "pad" ? ShardPolicy::kPad : ShardPolicy::kDrop;
  o.num_workers = Get<int>(d, "num_workers", o.num_workers);
  o.max_inflight_bytes = Get<int64_t>(d, "max_inflight_bytes", o.max_inflight_bytes);
  o.prefetch_batches = Get<int64_t>(d, "prefetch_batches", o.prefetch_batches);
  o.verify_checksums = Get<bool>(d, "verify_checksums", o.verify_checksums);
  o.debug_max_delay_us = Get<int64_t>(d, "debug_max_delay_us", o.debug_max_delay_us);
  o.io_threads = Get<int>(d, "io_threads", o.io_threads);
  o.readahead = Get<int64_t>(d, "readahead", o.readahead);
  o.dataset.storage.values =
      Get<std::map<std::string, std::string>>(d, "storage_options", {});
  o.dataset.columns.spec.strings_as_bytes = Get<bool>(d, "strings_as_bytes", false);
  o.dataset.row_groups = Get<std::map<std::string, std::vector<int>>>(d, "row_groups", {});
  o.dataset.use_summary = Get<bool>(d, "use_summary", o.dataset.use_summary);
  o.dataset.summary_only = Get<bool>(d, "summary_only", o.dataset.summary_only);
  if (d.contains("fill_default") && !d["fill_default"].is_none()) {
    o.default_fill = ToFill(d["fill_default"]);
  }
  if (d.contains("fills") && !d["fills"].is_none()) {
    for (auto [k, v] : nb::borrow<nb::dict>(d["fills"])) {
      o.fills[nb::cast<std::string>(k)] = ToFill(v);
    }
  }
  // transforms: {column: [(op name, {param: value})]}
  if (d.contains("transforms") && !d["transforms"].is_none()) {
    for (auto [column, ops] : nb::borrow<nb::dict>(d["transforms"])) {
      auto& list = o.transforms[nb::cast<std::string>(column)];
      for (nb::handle op : nb::borrow<nb::list>(ops)) list.push_back(ToOp(op));
    }
  }
  // lists: {column: {"mode": "pad" | "ragged", "length", "max_length", "multiple_of",
  // "value", "side", "truncation"}} (checked in Python).
  if (d.contains("lists") && !d["lists"].is_none()) {
    for (auto [column, spec] : nb::borrow<nb::dict>(d["lists"])) {
      nb::dict c = nb::borrow<nb::dict>(spec);
      ColumnCollate collate;
      const std::string mode = Get<std::string>(c, "mode", "ragged");
      collate.mode = mode == "pad" ? ColumnCollate::Mode::kPad : ColumnCollate::Mode::kRagged;
      collate.length = Get<int64_t>(c, "length", 0);
      collate.max_length = Get<int64_t>(c, "max_length", 0);
      collate.multiple_of = Get<int64_t>(c, "multiple_of", 1);
      collate.pad_value = Get<double>(c, "value", 0.0);
      collate.pad_left = Get<std::string>(c, "side", "right") == "left";
      collate.truncate_left = Get<std::string>(c, "truncation", "right") == "left";
      o.lists[nb::cast<std::string>(column)] = collate;
    }
  }
  // stack: [(name, [column, ...])] (checked in Python, and by the loader).
  if (d.contains("stack") && !d["stack"].is_none()) {
    for (nb::handle item : nb::borrow<nb::list>(d["stack"])) {
      nb::tuple t = nb::borrow<nb::tuple>(item);
      o.stack.push_back(StackSpec{nb::cast<std::string>(t[0]), nb::cast<std::vector<std::string>>(t[1])});
    }
  }
  // pack: {"column", "seq_len", "eos" (None: no separator), "truncate", "pad"}.
  if (d.contains("pack") && !d["pack"].is_none()) {
    nb::dict p = nb::borrow<nb::dict>(d["pack"]);
    o.pack_column = Get<std::string>(p, "column", "");
    o.pack.seq_len = Get<int64_t>(p, "seq_len", 0);
    o.pack.has_eos = p.contains("eos") && !p["eos"].is_none();
    o.pack.eos = Get<int64_t>(p, "eos", 0);
    o.pack.truncate = Get<bool>(p, "truncate", false);
    o.pack.pad_value = Get<double>(p, "pad", 0.0);
  }
  o.defer_checks = Get<bool>(d, "defer_checks", false);
  o.cache.dir = Get<std::string>(d, "cache_dir", "");
  o.cache.size_limit = Get<int64_t>(d, "cache_size_limit", 0);
  const std::string cache_policy = Get<std::string>(d, "cache_policy", "keep");
  o.cache.policy = cache_policy == "lru"    ? CachePolicy::kLru
                   : cache_policy == "plan" ? CachePolicy::kPlan
                                            : CachePolicy::kKeep;
  o.cache.shards = Get<int>(d, "cache_shards", o.cache.shards);
  o.cache.wait_timeout_ms = Get<int64_t>(d, "cache_wait_timeout_ms", o.cache.wait_timeout_ms);
  if (Get<std::string>(d, "on_decode_error", "raise") == "skip") {
    o.on_decode_error = DecodeErrorPolicy::kSkip;
  }
  return o;
}

int NumpyTypeNum(DType t) {
  switch (t) {
    case DType::kBool: return NPY_BOOL;
    case DType::kInt8: return NPY_INT8;
    case DType::kInt16: return NPY_INT16;
    case DType::kInt32: return NPY_INT32;
    case DType::kInt64: return NPY_INT64;
    case DType::kUInt8: return NPY_UINT8;
    case DType::kUInt16: return NPY_UINT16;
    case DType::kUInt32: return NPY_UINT32;
    case DType::kUInt64: return NPY_UINT64;
    case DType::kFloat16: return NPY_FLOAT16;
    case DType::kFloat32: return NPY_FLOAT32;
    case DType::kFloat64: return NPY_FLOAT64;
  }
  return NPY_UINT8;
}

// Wrap a column buffer as a NumPy array that keeps the buffer alive (no copy): made
// with NumPy's C API, whose arrays cost ~0.2 us each, where numpy.asarray of a
// buffer-protocol object (nanobind's ndarray export) parsed a PEP 3118 format string
// per array (~1 us: a batch of 101 columns spent 100 us in it, the whole hand-out of
// a shuffled cache-hit epoch; docs/performance.md).
nb::object TensorToNumpy(const BatchColumn& c) {
  if (c.shape.size() > 32) throw std::invalid_argument("a tensor of more than 32 dimensions");
  auto* owner = new std::shared_ptr<arrow::Buffer>(c.data);
  PyObject* capsule = PyCapsule_New(owner, nullptr, [](PyObject* cap) {
    delete static_cast<std::shared_ptr<arrow::Buffer>*>(PyCapsule_GetPointer(cap, nullptr));
  });
  if (capsule == nullptr) {
    delete owner;
    throw nb::python_error();
  }
  npy_intp dims[32];
  for (size_t i = 0; i < c.shape.size(); ++i) dims[i] = static_cast<npy_intp>(c.shape[i]);
  // Writable, as before: the batch's buffers are the caller's alone.
  PyObject* array = PyArray_NewFromDescr(
      &PyArray_Type, PyArray_DescrFromType(NumpyTypeNum(c.dtype)), static_cast<int>(c.shape.size()),
      dims, nullptr, const_cast<uint8_t*>(c.data->data()), NPY_ARRAY_CARRAY, nullptr);
  if (array == nullptr) {
    Py_DECREF(capsule);
    throw nb::python_error();
  }
  // Steals the capsule, also when it fails.
  if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(array), capsule) != 0) {
    Py_DECREF(array);
    throw nb::python_error();
  }
  return nb::steal(array);
}

// A kStringList/kBytesList row (see EncodeStringList in decode/convert.h) as a list.
nb::object StringListRow(const uint8_t* row, int64_t size, bool text) {
  uint32_t count = 0;
  if (size >= 4) std::memcpy(&count, row, 4);
  nb::list out;
  int64_t at = 4 + 4 * static_cast<int64_t>(count);
  for (uint32_t k = 0; k < count && at <= size; ++k) {
    uint32_t len = 0;
    std::memcpy(&len, row + 4 + 4 * static_cast<int64_t>(k), 4);
    if (at + len > size) break;
    const char* p = reinterpret_cast<const char*>(row + at);
    PyObject* item = text ? PyUnicode_DecodeUTF8(p, len, "strict") : PyBytes_FromStringAndSize(p, len);
    if (item == nullptr && text && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
      // Values are checked while decoding (with the file, row group and column named);
      // this is a backstop.
      PyErr_Clear();
      throw StatusError(MakeError(ErrorKind::kInvalidData, "a list of strings holds a value "
                                  "that is not valid UTF-8 (b'",
                                  Printable(std::string_view(p, len)),
                                  "'); pass strings=\"bytes\" to read such columns as bytes"));
    }
    if (item == nullptr) throw nb::python_error();
    out.append(nb::steal(item));
    at += len;
  }
  return out;
}

nb::object VarToList(const BatchColumn& c) {
  const auto* off = reinterpret_cast<const int64_t*>(c.offsets->data());
  const char* base = reinterpret_cast<const char*>(c.data->data());
  const int64_t n = c.shape[0];
  nb::list out;
  if (IsStringList(c.kind)) {
    for (int64_t i = 0; i < n; ++i) {
      out.append(StringListRow(reinterpret_cast<const uint8_t*>(base + off[i]), off[i + 1] - off[i],
                               c.kind == ColumnKind::kStringList));
    }
    return out;
  }
  for (int64_t i = 0; i < n; ++i) {
    const char* p = base + off[i];
    const Py_ssize_t len = off[i + 1] - off[i];
    PyObject* item = c.kind == ColumnKind::kString ? PyUnicode_DecodeUTF8(p, len, "strict")
                                                   : PyBytes_FromStringAndSize(p, len);
    if (item == nullptr && c.kind == ColumnKind::kString &&
        PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
      // Values are checked while decoding (with the file, row group and column named);
      // this is a backstop.
      PyErr_Clear();
      throw StatusError(MakeError(ErrorKind::kInvalidData, "row ", i,
                                  " of the batch holds a string that is not valid UTF-8 (b'",
                                  Printable(std::string_view(p, len)),
                                  "'); pass strings=\"bytes\" to read such columns as bytes"));
    }
    if (item == nullptr) throw nb::python_error();
    out.append(nb::steal(item));
  }
  return out;
}

// An elastic base from Python: None, or {"world_size": n, "batch_size": b,
// "batches": [k per old rank], "base": an earlier one or None} (see pqloader._state).
std::shared_ptr<const ElasticBase> ToElasticBase(const nb::object& obj, int depth = 0) {
  if (obj.is_none()) return nullptr;
  if (depth > 64) throw nb::value_error("elastic: resumed more than 64 times within one epoch");
  nb::dict d = nb::cast<nb::dict>(obj);
  auto base = std::make_shared<ElasticBase>();
  base->world_size = nb::cast<int64_t>(d["world_size"]);
  base->batch_size = nb::cast<int64_t>(d["batch_size"]);
  base->batches = nb::cast<std::vector<int64_t>>(d["batches"]);
  if (d.contains("base")) base->base = ToElasticBase(d["base"], depth + 1);
  return base;
}

// How often a waiting next() checks for signals (Ctrl-C).
constexpr std::chrono::milliseconds kSignalPoll{100};

// `make(cancel)` run on a thread of its own while this one, the GIL released, waits for
// it and runs Python's signal handlers every kSignalPoll: building a Loader reads every
// footer, may run a filter's mask pass or wait for another process's lock, minutes on a
// large dataset, and Ctrl-C used to wait for all of it. A handler that raises sets
// `cancel` (the work returns Cancelled at its next file, row group or poll), and its
// exception (KeyboardInterrupt) is raised once the work returned.
template <typename T>
T RunInterruptible(const std::function<arrow::Result<T>(const CancelFlag&)>& make) {
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::optional<arrow::Result<T>> result;
  };
  auto shared = std::make_shared<Shared>();
  auto run = [&make](const CancelFlag& flag) -> arrow::Result<T> {
    try {
      return make(flag);
    } catch (const std::exception& e) {
      return arrow::Status::UnknownError(e.what());
    }
  };
  std::thread worker;
  try {
    worker = std::thread([&run, shared, cancel] {
      ExitCancellable on_exit(cancel.get());  // the interpreter's exit cancels it too (gil.h)
      arrow::Result<T> r = run(cancel);
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->result.emplace(std::move(r));
      shared->done = true;
      shared->cv.notify_all();
    });
  } catch (const std::system_error&) {
    // The OS refused a thread (a limit of tasks): the work runs here, the GIL released,
    // not interruptible (it was a bare RuntimeError). What it starts later fails as it
    // says, naming the limit.
    arrow::Result<T> r = arrow::Status::UnknownError("not run");
    {
      pqloader::ScopedRelease release;
      r = run(cancel);
    }
    return Check(std::move(r));
  }
  bool interrupted = false;
  while (true) {
    bool done;
    {
      pqloader::ScopedRelease release;
      std::unique_lock<std::mutex> lock(shared->mu);
      done = shared->cv.wait_for(lock, kSignalPoll, [&] { return shared->done; });
    }
    if (done) break;
    if (!interrupted && PyErr_CheckSignals() != 0) {
      interrupted = true;
      cancel->store(true);
    }
  }
  {
    // Not with the GIL held: the worker's last step (~ExitCancellable) takes gil.cc's
    // mutex, which a thread returning from the engine holds while it waits for the GIL
    // (three threads building Loaders at once hung the process).
    pqloader::ScopedRelease release;
    worker.join();
  }
  if (interrupted) throw nb::python_error();  // the handler's exception, set above
  return Check(std::move(*shared->result));
}

// A mixture epoch's length (EpochLengthUntilExhausted), interruptible: it may take
// billions of draws (a large, skewed mixture with stop="last"), minutes.
int64_t EpochLengthInterruptible(uint64_t seed, int64_t epoch, const std::vector<double>& cum,
                                 const std::vector<int64_t>& rows, bool until_all, int64_t limit,
                                 std::vector<uint8_t>* kept = nullptr, int64_t max_kept = 0) {
  return RunInterruptible<int64_t>([&](const CancelFlag& cancel) -> arrow::Result<int64_t> {
    const int64_t n =
        EpochLengthUntilExhausted(seed, epoch, cum, rows, until_all, limit, kept, max_kept, cancel);
    if (n < 0) return CancelledStatus();
    return n;
  });
}

// Columns' names as Python strings, made once (each batch's dict takes them; the specs
// of a loader or a mixture never change).
class ColumnNames {
 public:
  const std::vector<nb::object>& Of(const std::vector<ColumnSpec>& specs) {
    if (names_.size() != specs.size()) {
      names_.clear();
      for (const ColumnSpec& spec : specs) {
        PyObject* name = PyUnicode_FromStringAndSize(spec.name.data(),
                                                     static_cast<Py_ssize_t>(spec.name.size()));
        if (name == nullptr) throw nb::python_error();
        PyUnicode_InternInPlace(&name);
        names_.push_back(nb::steal(name));
      }
    }
    return names_;
  }

 private:
  std::vector<nb::object> names_;
};

// A batch as {column name: array or list}: tensor columns as zero-copy NumPy views
// (the buffer goes back to the pool when the last view is dropped), others as lists.
nb::dict BatchToDict(const Batch& batch, const std::vector<ColumnSpec>& specs, ColumnNames& names) {
  const std::vector<nb::object>& keys = names.Of(specs);
  nb::dict out;
  for (size_t i = 0; i < specs.size(); ++i) {
    const BatchColumn& c = batch.columns[i];
    nb::object value = c.kind == ColumnKind::kTensor ? TensorToNumpy(c) : VarToList(c);
    if (PyDict_SetItem(out.ptr(), keys[i].ptr(), value.ptr()) != 0) throw nb::python_error();
  }
  return out;
}

class PyLoader {
 public:
  PyLoader(const std::vector<std::string>& sources, const nb::dict& options) {
    LoaderOptions o = ToOptions(options);
    seed_ = o.plan.seed;
    loader_ = RunInterruptible<std::unique_ptr<Loader>>(
        [&sources, &o](const CancelFlag& cancel) {
          LoaderOptions with = o;
          with.cancel = cancel;
          return Loader::Make(sources, with);
        });
  }

  /// Returns the run's id, for Next.
  int64_t StartEpoch(int64_t epoch, int64_t first_batch, bool then_next_epoch,
                     const nb::object& elastic) {
    auto base = ToElasticBase(elastic);
    pqloader::ScopedRelease release;
    // The loader's own epochs: never into a mixture's batches (a mixture that ended at
    // an epoch's end leaves its sources' next runs, and sinks, for its next epoch), and
    // under its own seed (a mixture's stream sets a source's seed to read it again).
    loader_->set_window_sink(nullptr);
    loader_->set_seed(seed_);
    int64_t run = -1;
    Check(loader_->StartEpoch(epoch, first_batch, then_next_epoch, std::move(base), &run));
    return run;
  }

  // Rows the batches of `epoch` hold (after drop_last; packing: blocks), under the seed.
  int64_t BatchRows(int64_t epoch) const {
    pqloader::ScopedRelease release;
    return loader_->batch_rows(epoch, seed_);
  }

  int64_t NumBatches(int64_t epoch, const nb::object& elastic) const {
    auto base = ToElasticBase(elastic);
    pqloader::ScopedRelease release;
    // Under its own seed: a mixture may be reading it under a wrap's (packed sources'
    // counts depend on the seed with several ranks).
    if (base == nullptr) return loader_->num_batches_under_seed(epoch, seed_);
    return Check(loader_->num_batches(epoch, *base));
  }

  /// Return the output columns' Arrow schema as a PyCapsule "arrow_schema" (the Arrow
  /// PyCapsule protocol): any Arrow implementation of any version imports it.
  nb::capsule ArrowSchemaCapsule() const {
    auto c_schema = std::make_unique<struct ArrowSchema>();
    Check(arrow::ExportSchema(*loader_->dataset().schema(), c_schema.get()));
    // A consumer that imports the schema moves it out and leaves `release` null.
    return nb::capsule(c_schema.release(), "arrow_schema", [](void* p) noexcept {
      auto* schema = static_cast<struct ArrowSchema*>(p);
      if (schema->release != nullptr) schema->release(schema);
      delete schema;
    });
  }

  /// `run`: a StartEpoch's id (-1: whatever run is current).
  nb::object Next(int64_t run) {
    std::shared_ptr<Batch> batch;
    while (true) {
      bool timed_out = false;
      {
        pqloader::ScopedRelease release;
        batch = Check(loader_->Next(kSignalPoll, &timed_out, run));
      }
      if (!timed_out) break;
      // Waiting for a batch: let Ctrl-C (and other signal handlers) run now, not when
      // the batch arrives. The epoch stays where it is; the caller may stop or go on.
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
    }
    if (batch == nullptr) return nb::none();
    if (batch->columns.size() != loader_->specs().size()) {  // a mixture's batch, counted only
      throw std::runtime_error("this loader's epoch writes a mixture's batches; iterate the mixture");
    }
    return BatchToDict(*batch, loader_->specs(), names_);
  }

  void SetSeed(uint64_t seed) {
    seed_ = seed;
    loader_->set_seed(seed);
  }
  void CheckBeforeFirstBatch() {
    pqloader::ScopedRelease release;
    Check(loader_->CheckBeforeFirstBatch());
  }
  std::string TakeWarning() { return loader_->TakeWarning(); }
  const Loader& loader() const { return *loader_; }
  Loader* mutable_loader() { return loader_.get(); }

  // Forget the engine without destroying it; called in a forked child only. The
  // engine's worker threads do not exist there and its mutexes may be held by them, so
  // neither Stop() nor the destructor may run. The child's copy of its memory leaks.
  // Its share of the buffer pool's cache is given back (its destructor never runs: the
  // child kept the parent's reservation, 2 x max_inflight_bytes, for its whole life).
  void AbandonAfterFork() {
    Loader* abandoned = loader_.release();
    if (abandoned != nullptr) abandoned->GiveBackPoolShareAfterFork();
  }

  void Stop() {
    pqloader::ScopedRelease release;
    loader_->Stop();
  }

  // Dropped without close(): its threads are joined here with the GIL released, as
  // close() joins them (the destructor runs with it held, and a thread freeing a reader
  // whose schema holds an extension type defined in Python, pandas' period or interval,
  // takes it: a Loader dropped after an epoch, its next one read ahead, hung the
  // process). What it holds is then freed with the GIL, as its Python objects need.
  // (Not in a forked child: AbandonAfterFork left nothing.)
  ~PyLoader() {
    if (loader_ != nullptr) {
      pqloader::ScopedRelease release;
      loader_->Close();
    }
  }

  void Close() {
    pqloader::ScopedRelease release;
    loader_->Close();
  }

  nb::dict Stats() const {
    const LoaderStats s = loader_->stats();
    nb::dict d;
    d["rows"] = s.rows;
    d["batches"] = s.batches;
    d["units_read"] = s.units_read;
    d["bytes_read"] = s.bytes_read;
    d["bytes_fetched"] = s.bytes_fetched;
    d["bytes_decoded"] = s.bytes_decoded;
    d["read_seconds"] = s.read_seconds;
    d["decode_seconds"] = s.decode_seconds;
    d["transform_seconds"] = s.transform_seconds;
    d["assemble_seconds"] = s.assemble_seconds;
    d["unit_seconds"] = s.unit_seconds;
    d["wait_seconds"] = s.wait_seconds;
    d["time_to_first_batch_seconds"] =
        s.time_to_first_batch_seconds < 0 ? nb::none() : nb::cast(s.time_to_first_batch_seconds);
    d["peak_inflight_bytes"] = s.peak_inflight_bytes;
    d["skipped_rows"] = s.skipped_rows;
    d["cache_hits"] = s.cache.hits;
    d["cache_misses"] = s.cache.misses;
    d["cache_inserts"] = s.cache.inserts;
    d["cache_bytes_written"] = s.cache.bytes_written;
    d["cache_bytes_saved"] = s.cache_bytes_saved;
    d["cache_skipped_full"] = s.cache.refused_room();  // before the reasons were told apart
    d["cache_refused_full"] = s.cache.refused_full;
    d["cache_refused_too_large"] = s.cache.refused_too_large;
    d["cache_refused_later"] = s.cache.refused_later;
    d["cache_refused_stale"] = s.cache.refused_stale;
    d["cache_evicted_stale"] = s.cache.evicted_stale;
    d["cache_evictions"] = s.cache.evictions;
    d["cache_corrupt"] = s.cache.corrupt;
    d["cache_read_errors"] = s.cache.read_errors;
    d["cache_write_errors"] = s.cache.write_errors;
    d["cache_waits"] = s.cache.waits;
    d["cache_wait_timeouts"] = s.cache.wait_timeouts;
    d["cache_wait_seconds"] = s.cache.wait_ns * 1e-9;
    d["batches_by_consumer"] = s.batches_by_consumer;
    d["epochs_started_ahead"] = s.epochs_started_ahead;
    d["units_dropped_ahead"] = s.units_dropped_ahead;
    d["pool_allocations"] = s.pool_allocations;
    d["pool_recycled"] = s.pool_recycled;
    d["pool_cached_bytes"] = s.pool_cached_bytes;
    d["pool_fresh_bytes"] = s.pool_fresh_bytes;
    return d;
  }

  // Per output column (as it would be without stack= when `stacked` is false).
  nb::list ColumnInfo(bool stacked) const {
    nb::list out;
    const auto& specs = stacked ? loader_->specs() : loader_->unstacked_specs();
    for (size_t c = 0; c < specs.size(); ++c) {
      const ColumnSpec& spec = specs[c];
      nb::dict d;
      d["name"] = Text(spec.name);
      d["transformed"] = spec.transformed;
      if (spec.transformed) {
        // What the ops declare before any data (Op::OutputSignature): None where it
        // depends on the data (DecodeNdarray without Cast), -1 for a data-dependent
        // dimension (an image's height and width before a crop).
        const std::optional<SampleSignature> sig =
            stacked ? loader_->output_signature(c) : loader_->unstacked_signature(c);
        if (sig.has_value() && sig->dtype.has_value()) {
          d["dtype"] = DTypeName(*sig->dtype);
        } else {
          d["dtype"] = nb::none();
        }
        if (sig.has_value() && sig->shape.has_value()) {
          nb::list shape;
          for (int64_t dim : *sig->shape) shape.append(dim);
          d["shape"] = nb::tuple(shape);
        } else {
          d["shape"] = nb::none();
        }
      } else {
        d["dtype"] = spec.kind == ColumnKind::kTensor ? DTypeName(spec.dtype)
                     : spec.kind == ColumnKind::kString || spec.kind == ColumnKind::kStringList
                         ? "str" : "bytes";
        nb::list shape;
        for (int64_t dim : spec.row_shape) shape.append(dim);
        if (IsStringList(spec.kind)) shape.append(-1);  // a list of str/bytes per row
        d["shape"] = nb::tuple(shape);
      }
      d["arrow_type"] = Text(spec.arrow_type);
      d["partition"] = spec.is_partition;
      d["mask"] = spec.mask_of >= 0;
      out.append(d);
    }
    return out;
  }

  nb::dict PlanInfo() const {
    const EpochPlan& p = loader_->first_plan();
    nb::dict d;
    d["num_batches"] = p.num_batches();
    d["num_rows"] = p.num_rows();
    d["dataset_rows"] = loader_->dataset().num_rows();
    d["dropped"] = p.dropped_rows();
    d["padded"] = p.padded_rows();
    d["drop_last_rows"] = p.drop_last_rows();
    d["num_files"] = loader_->dataset().files().size();
    d["num_row_groups"] = loader_->dataset().splits().size();
    d["max_window_bytes"] = loader_->MaxWindowBytes();
    d["gathers_windows"] = loader_->gathers_windows();
    d["footers_from_cache"] = loader_->dataset().footers_from_cache();
    d["footers_from_summary"] = loader_->dataset().footers_from_summary();
    const DocumentLengths* lengths = loader_->document_lengths();
    d["pack_lengths_from_cache"] = lengths != nullptr ? lengths->files_from_store() : 0;
    d["pack_lengths_stored"] = lengths != nullptr ? lengths->files_stored() : 0;
    const FilterStats& f = loader_->filter_stats();
    nb::dict filter;
    filter["files"] = f.files;
    filter["files_pruned"] = f.files_pruned;
    filter["row_groups"] = f.row_groups;
    filter["row_groups_pruned_partition"] = f.row_groups_pruned_partition;
    filter["row_groups_pruned_statistics"] = f.row_groups_pruned_statistics;
    filter["row_groups_all_rows"] = f.row_groups_all_rows;
    filter["row_groups_masked"] = f.row_groups_masked;
    filter["row_groups_pruned_mask"] = f.row_groups_pruned_mask;
    filter["rows"] = f.rows;
    filter["rows_kept"] = f.rows_kept;
    filter["bytes"] = f.bytes;
    filter["bytes_pruned"] = f.bytes_pruned;
    filter["mask_bytes_read"] = f.mask_bytes_read;
    filter["from_store"] = f.from_store;
    d["filter"] = filter;
    nb::list skipped;
    for (const auto& f : loader_->dataset().skipped_files()) {
      skipped.append(nb::make_tuple(f.path, f.reason));
    }
    d["skipped_files"] = skipped;
    nb::list files;
    for (const auto& f : loader_->dataset().files()) {
      // The footer's hash where it is the file's own: a state of a file rewritten with
      // the same size and rows is then refused.
      files.append(nb::make_tuple(f.display, f.size, f.num_rows(),
                                  f.footer_hash_is_own ? nb::object(nb::str(f.footer_hash.c_str()))
                                                       : nb::none()));
    }
    d["files"] = files;
    return d;
  }

 private:
  std::unique_ptr<Loader> loader_;
  uint64_t seed_ = 0;  // its own seed (set_seed), for its own epochs
  ColumnNames names_;  // touched with the GIL held only
};

nb::dict Inspect(const std::vector<std::string>& sources,
                 const std::map<std::string, std::string>& storage_options, Progress* progress,
                 const std::string& int96_unit) {
  const DatasetSummary summary = RunInterruptible<DatasetSummary>([&](const CancelFlag& cancel) {
    return InspectDataset(sources, StorageOptions{storage_options}, progress, cancel,
                          Int96Unit(int96_unit));
  });
  nb::dict out;
  nb::list files;
  int64_t rows = 0, groups = 0;
  for (const auto& f : summary.files) {
    nb::dict d;
    d["path"] = f.path;
    d["num_rows"] = f.num_rows;
    d["num_row_groups"] = f.num_row_groups;
    d["size_bytes"] = f.size;
    d["compression"] = Text(f.compression);
    // The writer's text, whatever its bytes: a created_by that is not UTF-8 failed the
    // conversion, reported as "'.' holds a file ... whose name is not UTF-8"
    d["created_by"] = Text(f.created_by);
    files.append(d);
    // (saturated: hostile footers' counts; _inspect.py sums them exactly)
    if (__builtin_add_overflow(rows, f.num_rows, &rows)) rows = std::numeric_limits<int64_t>::max();
    groups += f.num_row_groups;
  }
  nb::dict schema, loads_as;
  nb::list ragged;
  for (const auto& c : summary.columns) {
    schema[Text(c.name)] = Text(c.arrow_type);
    loads_as[Text(c.name)] = Text(c.loads_as);
    if (c.ragged) ragged.append(Text(c.name));
  }
  nb::list skipped;
  for (const auto& f : summary.skipped) {
    nb::dict d;
    d["path"] = f.path;
    d["reason"] = Text(f.reason);
    skipped.append(d);
  }
  out["files"] = files;
  out["skipped"] = skipped;
  out["schema"] = schema;
  out["loads_as"] = loads_as;
  out["ragged"] = ragged;
  out["num_rows"] = rows;
  out["num_row_groups"] = groups;
  out["num_files"] = summary.files.size();
  return out;
}

// The row lengths of list columns `columns` of `sources`: one pass over each column
// (DocumentLengths, as packing reads them), summarized per column.
nb::dict ListLengths(const std::vector<std::string>& sources,
                     const std::map<std::string, std::string>& storage_options,
                     const std::vector<std::string>& columns) {
  using Stats = std::vector<std::pair<LengthStats, int64_t>>;  // and the null rows
  const Stats stats = RunInterruptible<Stats>([&](const CancelFlag& cancel) -> arrow::Result<Stats> {
    DatasetOptions options;
    options.columns.columns = columns;
    options.storage = StorageOptions{storage_options};
    options.cancel = cancel;
    ARROW_ASSIGN_OR_RAISE(auto dataset, Dataset::Open(sources, options));
    const int threads = AvailableCpus();
    Stats out;
    for (size_t c = 0; c < columns.size(); ++c) {
      // A null row (or a file without the column) counts as an empty list, as fill_null
      // loads it, and is counted apart.
      ARROW_ASSIGN_OR_RAISE(auto lengths,
                            DocumentLengths::Read(*dataset, static_cast<int>(c), true, "", threads,
                                                  arrow::default_memory_pool(), cancel));
      out.emplace_back(SummarizeLengths(lengths->lengths()), lengths->null_rows());
    }
    return out;
  });
  nb::dict out;
  for (size_t c = 0; c < columns.size(); ++c) {
    const LengthStats& s = stats[c].first;
    nb::dict d;
    d["rows"] = s.rows;
    d["nulls"] = stats[c].second;
    d["total"] = s.total;
    d["min"] = s.min;
    d["median"] = s.median;
    d["p99"] = s.p99;
    d["max"] = s.max;
    d["mean"] = s.rows > 0 ? static_cast<double>(s.total) / static_cast<double>(s.rows) : 0.0;
    out[columns[c].c_str()] = d;
  }
  return out;
}

// Paths (and "PATH: reason" lines) as os.fsdecode makes them: a file whose name is not
// UTF-8 must not turn the report of a clear that happened into a UnicodeDecodeError.
nb::list FsDecodedList(const std::vector<std::string>& names) {
  nb::list out;
  for (const std::string& name : names) {
    PyObject* text =
        PyUnicode_DecodeFSDefaultAndSize(name.data(), static_cast<Py_ssize_t>(name.size()));
    if (text == nullptr) throw nb::python_error();
    out.append(nb::steal(text));
  }
  return out;
}

}  // namespace

// pqloader.mix: the draws of a mixture (mix/mix_draws.h) and the row interleave, with
// the GIL released.
using Int32Array = nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>;

Int32Array MixDraws(uint64_t seed, int64_t epoch, int64_t start, int64_t count,
                    const std::vector<double>& cumulative) {
  if (count < 0 || start < 0) throw nb::value_error("start and count must be >= 0");
  auto* data = new std::vector<int32_t>(static_cast<size_t>(count));
  {
    pqloader::ScopedRelease release;
    DrawSources(seed, epoch, start, count, cumulative, data->data());
  }
  nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
  size_t shape[1] = {static_cast<size_t>(count)};
  return Int32Array(data->data(), 1, shape, owner);
}

// An epoch's draws kept by mix_epoch_length_kept for its MixStream (a byte per position).
struct PyMixKeptDraws {
  std::shared_ptr<const std::vector<uint8_t>> draws;
};

// One epoch of a mixture (mix/mix_stream.h) over the engines of Python Loaders, which it
// keeps alive. next() releases the GIL while it waits for the sources and assembles.
class PyMixStream {
 public:
  bool in_place() const { return stream_ != nullptr && stream_->in_place(); }
  void SetNextEpoch(int64_t samples, int64_t num_batches, const PyMixKeptDraws* kept) {
    if (stream_ != nullptr) stream_->SetNextEpoch(samples, num_batches, kept != nullptr ? kept->draws : nullptr);
  }
  PyMixStream(const std::vector<nb::object>& loaders, const std::vector<uint64_t>& seeds,
              const std::vector<double>& cumulative, uint64_t seed,
              int64_t batch_size, int64_t epoch, int64_t first_batch, int64_t samples,
              int64_t num_batches, const nb::object& source_column, bool then_next_epoch,
              const PyMixKeptDraws* kept_draws, const std::vector<std::string>& names)
      : loaders_(loaders) {
    if (seeds.size() != loaders.size()) throw nb::value_error("MixStream: one seed per source");
    if (!names.empty() && names.size() != loaders.size()) {
      throw nb::value_error("MixStream: one name per source");
    }
    std::vector<MixSource> sources;
    for (size_t i = 0; i < loaders.size(); ++i) {
      Loader* loader = nb::cast<PyLoader*>(loaders[i])->mutable_loader();
      if (loader == nullptr) throw nb::value_error("MixStream: a source has no engine");
      sources.push_back(MixSource{loader, seeds[i], names.empty() ? "" : names[i]});
    }
    if (!source_column.is_none()) source_column_ = nb::cast<std::string>(source_column);
    MixStreamOptions o;
    o.seed = seed;
    o.cumulative = cumulative;
    o.batch_size = batch_size;
    o.epoch = epoch;
    o.first_batch = first_batch;
    o.samples = samples;
    o.num_batches = num_batches;
    o.then_next_epoch = then_next_epoch;
    if (kept_draws != nullptr) o.kept_draws = kept_draws->draws;
    specs_ = sources[0].loader->specs();
    pqloader::ScopedRelease release;
    stream_ = Check(MixStream::Make(std::move(sources), std::move(o), RecyclingPool::Global()));
  }

  nb::object Next() {
    std::shared_ptr<Batch> batch;
    std::shared_ptr<arrow::Buffer> sources;
    while (true) {
      bool timed_out = false;
      {
        pqloader::ScopedRelease release;
        if (getpid() != pid_) {  // (its mutex too may have been held at the fork)
          throw std::runtime_error(
              "this mixture iterator was made before the process forked; iterate the mixture "
              "again in this process");
        }
        std::lock_guard<std::mutex> lock(mu_);
        if (stopped_) {
          throw std::runtime_error(
              "this mixture iterator is stale: a newer iteration, set_epoch, load_state_dict or "
              "close() replaced it");
        }
        auto next = stream_->Next(kSignalPoll, &timed_out, source_column_.empty() ? nullptr : &sources);
        // A source started or stopped by another caller (mix_stream.h): a misuse, as
        // a stale iterator is.
        if (next.status().IsCancelled()) throw std::runtime_error(next.status().message());
        batch = Check(std::move(next));
      }
      if (!timed_out) break;
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
    }
    if (batch == nullptr) return nb::none();
    nb::dict out = BatchToDict(*batch, specs_, names_);
    if (!source_column_.empty()) {
      BatchColumn c;
      c.dtype = DType::kInt64;
      c.shape = {batch->num_rows};
      c.data = std::move(sources);
      out[source_column_.c_str()] = TensorToNumpy(c);
    }
    return out;
  }

  // From any thread: a next() running in another one returns first (within kSignalPoll)
  // and the stream's later next() calls raise. Idempotent.
  void Stop() {
    if (getpid() != pid_) return;  // forked: see the destructor
    pqloader::ScopedRelease release;
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    stream_->Stop();
  }

  // In a forked child the sources' engines were abandoned (PyLoader::AbandonAfterFork)
  // and their threads do not exist: the stream is forgotten, never stopped.
  ~PyMixStream() {
    if (getpid() != pid_) (void)stream_.release();
  }

 private:
  std::mutex mu_;  // one of next() and stop() at a time
  bool stopped_ = false;
  pid_t pid_ = getpid();  // the process that made the stream
  std::vector<nb::object> loaders_;  // keeps the engines alive
  std::vector<ColumnSpec> specs_;
  ColumnNames names_;
  std::string source_column_;
  std::unique_ptr<MixStream> stream_;
};
}  // namespace pqloader

NB_MODULE(_core, m) {
  using pqloader::PyLoader;
  if (_import_array() < 0) throw nb::python_error();
  // Fork handlers from the start: the Arrow loaded with us has jemalloc, whose data every
  // thread that forks gets (see fork_gate.cc, ClearInheritedThreadData).
  pqloader::fork_gate::Install();
  m.doc() = "pqloader engine (C++). Use the public API in `pqloader`.";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const pqloader::StatusError& e) {
      pqloader::RaisePython(e);
    }
  });
  nb::class_<PyLoader>(m, "_Loader")
      .def(nb::init<const std::vector<std::string>&, const nb::dict&>(), "sources"_a,
           "options"_a)
      .def("start_epoch", &PyLoader::StartEpoch, "epoch"_a, "first_batch"_a = 0,
           "then_next_epoch"_a = false, "elastic"_a = nb::none())
      .def("next", &PyLoader::Next, "run"_a = -1)
      .def("stop", &PyLoader::Stop)
      .def("close", &PyLoader::Close)
      .def("set_seed", &PyLoader::SetSeed, "seed"_a)
      .def("check_before_first_batch", &PyLoader::CheckBeforeFirstBatch)
      .def("take_warning", &PyLoader::TakeWarning)
      .def("abandon_after_fork", &PyLoader::AbandonAfterFork)
      .def("stats", &PyLoader::Stats)
      .def("column_info", &PyLoader::ColumnInfo, "stacked"_a = true)
      .def("arrow_schema_capsule", &PyLoader::ArrowSchemaCapsule)
      .def("plan_info", &PyLoader::PlanInfo)
      .def("transform_fingerprint",
           [](const PyLoader& l) {
             // Packing changes batches as transforms do; it rides in this field so that
             // states of loaders without it keep their form.
             std::string f = l.loader().transforms().Fingerprint();
             if (!l.loader().options().pack_column.empty()) {
               f += "|" + l.loader().options().pack.ToString();
             }
             // So do filters (by their expression; a predicate by the columns it reads).
             const pqloader::FilterOptions& filter = l.loader().options().filter;
             if (!filter.serialized_expression.empty()) {
               const std::string described = pqloader::DescribeExpression(filter.serialized_expression);
               f += "|filter=" + described;
               // Arrow abbreviates long value sets ("0, 1, ..., 39"), and prints their
               // strings unescaped, one a line: then the bytes tell filters apart (isin of
               // 40 values against 39, or of 'a",\n  "b' against 'a' and 'b', resumed
               // silently).
               if (described.find("...") != std::string::npos ||
                   pqloader::ValueSetPrintsAmbiguously(filter.serialized_expression)) {
                 // (Of the engine's serialization: the user's pyarrow's bytes differ by
                 // version, and a pyarrow 14 state was refused under 25.)
                 f += "#" + pqloader::FooterHash(
                                pqloader::CanonicalExpression(filter.serialized_expression));
               }
               // And literals whose text leaves their type out (float32 0.1 as 0.1, a
               // double 2.0 as 2): their types, only where there are such (other
               // filters' states keep their form).
               const std::string types =
                   pqloader::AmbiguousLiteralTypes(filter.serialized_expression);
               if (!types.empty()) f += "|filter-literals=" + types;
             }
             for (const auto& c : filter.predicate_columns) f += "|predicate:" + c;
             return f;
           })
      .def("num_batches", &PyLoader::NumBatches, "epoch"_a, "elastic"_a = nb::none())
      .def("batch_rows", &PyLoader::BatchRows, "epoch"_a);
  // Progress of inspect / write_index (footers read of how many), polled by the CLI.
  nb::class_<pqloader::Progress>(m, "Progress")
      .def(nb::init<>())
      .def_prop_ro("done", [](const pqloader::Progress& p) { return p.done.load(); })
      .def_prop_ro("total", [](const pqloader::Progress& p) { return p.total.load(); });
  m.def("inspect", &pqloader::Inspect, "sources"_a, "storage_options"_a,
        "progress"_a = nb::none(), "int96_unit"_a = "ns");
  m.def("mix_cumulative", &pqloader::CumulativeWeights, "weights"_a);
  m.def("mix_draws", &pqloader::MixDraws, "seed"_a, "epoch"_a, "start"_a, "count"_a, "cumulative"_a);
  // The first of positions [0, end) that draws a source in `wanted`, and that source:
  // (end, -1) if none does. Interruptible (end may be a trillion samples).
  m.def("mix_first_draw", [](uint64_t seed, int64_t epoch, int64_t end, const std::vector<double>& cum,
                             const std::vector<uint8_t>& wanted) {
    if (wanted.size() != cum.size()) throw std::invalid_argument("wanted: one flag per source");
    const int64_t first = pqloader::RunInterruptible<int64_t>(
        [&](const pqloader::CancelFlag& cancel) -> arrow::Result<int64_t> {
          const int64_t n = pqloader::FirstDrawOf(seed, epoch, end, cum, wanted, cancel);
          if (n < 0) return pqloader::CancelledStatus();
          return n;
        });
    return nb::make_tuple(first, first < end ? pqloader::DrawSource(seed, epoch, first, cum) : -1);
  }, "seed"_a, "epoch"_a, "end"_a, "cumulative"_a, "wanted"_a);
  m.def("mix_epoch_length", [](uint64_t seed, int64_t epoch, const std::vector<double>& cum,
                               const std::vector<int64_t>& rows, bool until_all, int64_t limit) {
    return pqloader::EpochLengthInterruptible(seed, epoch, cum, rows, until_all, limit);
  }, "seed"_a, "epoch"_a, "cumulative"_a, "rows"_a, "until_all"_a, "limit"_a);
  nb::class_<pqloader::PyMixKeptDraws>(m, "MixKeptDraws")
      .def("__len__", [](const pqloader::PyMixKeptDraws& k) { return k.draws->size(); });
  // The epoch length as mix_epoch_length, and its draws kept (None where they are not:
  // above max_kept positions or 256 sources) for the epoch's MixStream.
  m.def("mix_epoch_length_kept", [](uint64_t seed, int64_t epoch, const std::vector<double>& cum,
                                    const std::vector<int64_t>& rows, bool until_all,
                                    int64_t limit, int64_t max_kept) {
    auto kept = std::make_shared<std::vector<uint8_t>>();
    const int64_t n = pqloader::EpochLengthInterruptible(seed, epoch, cum, rows, until_all,
                                                         limit, kept.get(), max_kept);
    nb::object draws = nb::none();
    if (n > 0 && static_cast<int64_t>(kept->size()) == n) {
      draws = nb::cast(pqloader::PyMixKeptDraws{std::move(kept)});
    }
    return nb::make_tuple(n, draws);
  }, "seed"_a, "epoch"_a, "cumulative"_a, "rows"_a, "until_all"_a, "limit"_a, "max_kept"_a);
  nb::class_<pqloader::PyMixStream>(m, "MixStream")
      .def(nb::init<const std::vector<nb::object>&, const std::vector<uint64_t>&,
                    const std::vector<double>&, uint64_t, int64_t,
                    int64_t, int64_t, int64_t, int64_t, const nb::object&, bool,
                    const pqloader::PyMixKeptDraws*, const std::vector<std::string>&>(),
           "loaders"_a, "seeds"_a, "cumulative"_a, "seed"_a, "batch_size"_a, "epoch"_a,
           "first_batch"_a, "samples"_a, "num_batches"_a, "source_column"_a.none(),
           "then_next_epoch"_a = false, "kept_draws"_a.none() = nb::none(),
           "names"_a = std::vector<std::string>{})
      .def("next", &pqloader::PyMixStream::Next)
      .def_prop_ro("in_place", &pqloader::PyMixStream::in_place)
      .def("set_next_epoch", &pqloader::PyMixStream::SetNextEpoch, "samples"_a, "num_batches"_a,
           "kept_draws"_a.none() = nb::none())
      .def("stop", &pqloader::PyMixStream::Stop);
  m.def("list_lengths", &pqloader::ListLengths, "sources"_a, "storage_options"_a, "columns"_a);
  // S3 must be shut down before the interpreter's static destructors run.
  m.def("_finalize_s3", [] {
    pqloader::ScopedRelease release;
    pqloader::Check(pqloader::FinalizeS3());
  });
  nb::module_::import_("atexit").attr("register")(m.attr("_finalize_s3"));
  // Registered by pqloader._process, to run before its engines are stopped (gil.h).
  m.def("_mark_interpreter_exiting", &pqloader::MarkInterpreterExiting, "other_threads"_a);
  // A forked child: objects that the parent's other threads held are never freed there.
  m.def("_quiet_leak_warnings", [] { nb::set_leak_warnings(false); });
  m.def("draw_seed", &pqloader::DrawFreshSeed);
  // pqloader.available_cpus(), the engine's default thread count; the quota part alone, of
  // a /proc directory given, for tests (fake trees).
  m.def("available_cpus", &pqloader::AvailableCpus);
  m.def("_cgroup_cpu_quota", &pqloader::CgroupCpuQuota, "proc"_a);
  // The cgroup memory limit the default max_inflight_bytes is sized by (_env.py).
  m.def("_cgroup_memory_limit", &pqloader::CgroupMemoryLimit, "proc"_a);
  // The default max_inflight_bytes for that limit, shared by `share` loaders (_env.py).
  m.def("_default_inflight_bytes", &pqloader::DefaultInflightBytes, "memory_limit"_a.none(),
        "share"_a = 1);
  // A schema handed in through the Arrow PyCapsule protocol (`__arrow_c_schema__` of any
  // Arrow implementation, any version) as Arrow IPC bytes, which the option dict carries
  // (bytes survive a fork and a reopen; a capsule imports once).
  m.def("_schema_ipc", [](nb::handle capsule) {
    void* p = PyCapsule_GetPointer(capsule.ptr(), "arrow_schema");
    if (p == nullptr) {
      PyErr_Clear();
      throw nb::type_error("schema.__arrow_c_schema__() did not return a PyCapsule named "
                           "\"arrow_schema\"");
    }
    auto* c_schema = static_cast<struct ArrowSchema*>(p);
    if (c_schema->release == nullptr) throw nb::value_error("the schema capsule was consumed");
    auto schema = arrow::ImportSchema(c_schema);  // moves the struct out, releases it
    if (!schema.ok()) {
      throw nb::type_error(("schema must be an Arrow schema (a struct of fields): " +
                            schema.status().message()).c_str());
    }
    auto buffer = pqloader::Check(arrow::ipc::SerializeSchema(**schema));
    return nb::bytes(reinterpret_cast<const char*>(buffer->data()),
                     static_cast<size_t>(buffer->size()));
  });
  // Bench and test helper: the split of each unit rank `rank` reads in `epoch`, in order
  // (bench/cache_policies.py replays it to compute the offline optimum of a cache).
  m.def("_epoch_unit_splits", [](const std::vector<int64_t>& split_rows, int64_t batch_size,
                                 bool shuffle, uint64_t seed, int64_t shuffle_window,
                                 int64_t rank, int64_t world_size, int64_t epoch) {
    pqloader::PlanOptions o;
    o.batch_size = batch_size;
    o.shuffle = shuffle;
    o.seed = seed;
    o.shuffle_window = shuffle_window;
    o.rank = rank;
    o.world_size = world_size;
    const std::string invalid = pqloader::ValidatePlanOptions(o);
    if (!invalid.empty()) throw nb::value_error(invalid.c_str());
    const pqloader::EpochPlan plan = pqloader::EpochPlan::Make(split_rows, o, epoch);
    std::vector<int64_t> out;
    for (const auto& u : plan.units()) out.push_back(u.split);
    return out;
  });
  m.def("write_index", [](const std::string& source,
                          const std::map<std::string, std::string>& storage_options,
                          pqloader::Progress* progress) {
    const auto r = pqloader::RunInterruptible<pqloader::IndexResult>(
        [&](const pqloader::CancelFlag& cancel) {
          return pqloader::WriteDatasetIndex(source, pqloader::StorageOptions{storage_options}, 8,
                                             progress, cancel);
        });
    nb::dict d;
    d["metadata_path"] = r.metadata_path;
    d["files"] = r.files;
    d["row_groups"] = r.row_groups;
    d["rows"] = r.rows;
    d["bytes"] = r.bytes;
    return d;
  }, "source"_a, "storage_options"_a, "progress"_a = nb::none());
  m.def("cache_stats", [](const std::string& dir, const std::vector<std::string>& dataset,
                          const std::map<std::string, std::string>& storage_options) {
    const auto s = pqloader::RunInterruptible<pqloader::CacheDirStats>(
        [&](const pqloader::CancelFlag& cancel) {
          return pqloader::InspectCache(
              dir, pqloader::CacheAdminOptions{dataset, pqloader::StorageOptions{storage_options},
                                               cancel});
        });
    nb::dict d;
    d["entries"] = s.entries;
    d["bytes"] = s.bytes;
    d["temp_files"] = s.temp_files;
    d["fetch_markers"] = s.fetch_markers;
    d["stale_entries"] = s.stale_entries;
    d["stale_bytes"] = s.stale_bytes;
    d["unverified_entries"] = s.unverified_entries;
    d["selections"] = s.selections;
    d["selection_bytes"] = s.selection_bytes;
    d["lengths"] = s.lengths;
    d["lengths_bytes"] = s.lengths_bytes;
    d["footers"] = s.footers;
    d["footer_bytes"] = s.footer_bytes;
    for (const auto& [k, v] : s.recorded) d[k.c_str()] = v;
    return d;
  }, "dir"_a, "dataset"_a, "storage_options"_a);
  m.def("cache_prune", [](const std::string& dir, const std::vector<std::string>& dataset,
                          const std::map<std::string, std::string>& storage_options) {
    const auto r = pqloader::RunInterruptible<pqloader::CachePruneReport>(
        [&](const pqloader::CancelFlag& cancel) {
          return pqloader::PruneCache(
              dir, pqloader::CacheAdminOptions{dataset, pqloader::StorageOptions{storage_options},
                                               cancel});
        });
    nb::dict d;
    d["entries"] = r.entries;
    d["bytes"] = r.bytes;
    d["kept"] = r.kept;
    d["unverified_entries"] = r.unverified_entries;
    d["not_removed"] = pqloader::FsDecodedList(r.not_removed);
    d["not_removed_count"] = r.not_removed_count;
    return d;
  }, "dir"_a, "dataset"_a, "storage_options"_a);
  m.def("cache_clear", [](const std::string& dir) {
    const auto r = pqloader::RunInterruptible<pqloader::CacheClearReport>(
        [&](const pqloader::CancelFlag& cancel) { return pqloader::ClearCacheDir(dir, cancel); });
    nb::dict d;
    d["entries"] = r.entries;
    d["bytes"] = r.bytes;
    d["other_files"] = r.other_files;
    d["foreign"] = pqloader::FsDecodedList(r.foreign);
    d["foreign_count"] = r.foreign_count;
    d["not_removed"] = pqloader::FsDecodedList(r.not_removed);
    d["not_removed_count"] = r.not_removed_count;
    return d;
  });
  // Test helper: the crop a RandomResizedCrop at `op_index` draws for one sample.
  m.def("_random_resized_crop_params",
        [](uint64_t seed, int64_t epoch, int64_t sample, int op_index, int64_t height,
           int64_t width, std::vector<double> scale, std::vector<double> ratio) {
          auto rng = pqloader::CounterRng::ForSample(seed, epoch, sample, op_index);
          auto box = pqloader::RandomResizedCropParams(height, width, scale[0], scale[1],
                                                       ratio[0], ratio[1], &rng);
          return nb::make_tuple(box.top, box.left, box.height, box.width);
        });
  // Test helper: apply a list of ops to one sample given as bytes or an ndarray.
  m.def("_apply_ops", [](nb::list ops, nb::bytes data, uint64_t seed, int64_t epoch,
                         int64_t sample) {
    pqloader::SampleTensor s;
    s.dtype = pqloader::DType::kUInt8;
    s.shape = {static_cast<int64_t>(data.size())};
    s.data = arrow::Buffer::FromString(std::string(data.c_str(), data.size()));
    pqloader::SampleContext ctx{seed, epoch, sample};
    int index = 0;
    for (nb::handle op : ops) s = pqloader::Check(pqloader::ToOp(op)->Apply(s, ctx, index++));
    pqloader::BatchColumn c;
    c.dtype = s.dtype;
    c.shape = s.shape;
    c.data = s.data;
    return pqloader::TensorToNumpy(c);
  });
}
