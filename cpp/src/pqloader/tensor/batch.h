// Tensors, decoded columns and batches.
//
// A DecodedUnit holds the columns of one unit (a row range of one split) in the
// layout the batch wants: fixed-shape rows packed contiguously, or variable-length
// bytes with int64 offsets. A Batch holds `num_rows` rows of each column in buffers
// aligned to their element size (offsets to 8 bytes): slices, at the batch's first row,
// of a block from a memory pool (64-byte aligned), of a unit's buffers or of a shuffle
// window's gathered copy;
// its buffers are reference counted, so they can be exported zero-copy (NumPy, DLPack)
// and go back to the pool when the last reference is dropped.
// Thread-safety: immutable once built; shareable across threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <arrow/buffer.h>
#include <arrow/memory_pool.h>
#include <arrow/result.h>
#include <arrow/status.h>

#include "pqloader/plan/epoch_plan.h"

namespace pqloader {

/// Element type of a tensor column. Names follow NumPy.
enum class DType : uint8_t {
  kBool, kInt8, kInt16, kInt32, kInt64, kUInt8, kUInt16, kUInt32, kUInt64,
  kFloat16, kFloat32, kFloat64,
};

/// Return the size of one element in bytes.
int64_t DTypeSize(DType dtype);
/// Return the NumPy name of `dtype`, e.g. "float32".
const char* DTypeName(DType dtype);
/// Read one element of `dtype` at `p` as a double.
double LoadScalar(DType dtype, const uint8_t* p);
/// Whether padding with `v` keeps it exactly in elements of `t` (integers: whole and in
/// range; bool: 0 or 1; floats: not rounding to inf): list pads and packing's eos/pad.
bool PadValueFits(DType t, double v);

/// Write `v` as one element of `dtype` at `p`: truncation toward zero; NaN, inf and values
/// out of range as x86-64 converts them, on every platform (batch.cc).
void StoreScalar(DType dtype, double v, uint8_t* p);
/// Return a shape as Python writes it: "(a, b)", "(a,)", "()".
std::string ShapeToString(const std::vector<int64_t>& shape);

enum class ColumnKind {
  kTensor,      ///< Fixed-shape rows of `dtype`.
  kBytes,       ///< Variable-length binary rows.
  kString,      ///< Variable-length UTF-8 rows.
  kStringList,  ///< A list of UTF-8 strings per row, encoded (see EncodeStringList).
  kBytesList,   ///< A list of binary values per row, encoded (see EncodeStringList).
};

/// Whether rows of `kind` are variable-length bytes (offsets + data) in units and batches.
inline bool IsVarLength(ColumnKind kind) { return kind != ColumnKind::kTensor; }
/// Whether rows of `kind` are lists of strings or bytes.
inline bool IsStringList(ColumnKind kind) {
  return kind == ColumnKind::kStringList || kind == ColumnKind::kBytesList;
}

/// The static description of one output column.
struct ColumnSpec {
  std::string name;
  ColumnKind kind = ColumnKind::kTensor;
  DType dtype = DType::kUInt8;
  /// Shape of one row; -1 for a dimension known only once data is decoded (lists).
  std::vector<int64_t> row_shape;
  /// The column's Arrow type as read from Parquet, e.g. "timestamp[us, tz=UTC]".
  std::string arrow_type;
  /// True for a column made from hive partition directories (`key=value`).
  bool is_partition = false;
  /// True when transforms produce the column (dtype and row shape known only then).
  bool transformed = false;
  /// True for a column of text, or of lists of text, also where `kind` hands it out as
  /// bytes (strings="bytes"): transforms refuse it (they would see its UTF-8 codes).
  bool text = false;
  /// For a "<name>_valid" column: the index (in the same spec list) of the column whose
  /// rows it marks valid (bool, true where the value is not null). -1 otherwise.
  int mask_of = -1;
  /// For a decimal column (or a list of decimals): the column's scale, to which a file's
  /// values of a smaller scale are rescaled (exactly) before they become float64, as
  /// pyarrow casts them to the column's type first. -1 otherwise.
  int32_t decimal_scale = -1;
};

/// One sample of one column: an n-d tensor with its own shape (see transform/op.h).
struct SampleTensor {
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  /// Bytes of the sample (shape product × DTypeSize), C order; may view a larger buffer.
  std::shared_ptr<arrow::Buffer> data;
  /// Image layout: true once ToCHW ran (channels first), else channels last.
  bool channels_first = false;
  /// Set by a DCT-scaled DecodeImage: the height and width of the image at full size
  /// and the scale it was decoded at (e.g. 0.75). A following Resize sizes its output
  /// by the full size and maps pixels by the exact scale (the decoder rounds the scaled
  /// size up), so scaling changes neither the output shape nor the alignment. 0 otherwise.
  int64_t full_height = 0, full_width = 0;
  double decode_scale = 0;

  int64_t num_elements() const;
};

/// What the rows of one column are known to be before any data is seen: the output of
/// its transforms (see Op::OutputSignature), or its spec. A batch without rows (every
/// row skipped by on_decode_error="skip") gives a tensor column as an empty tensor of
/// this dtype and row shape.
struct SampleSignature {
  /// Unset where it depends on the data (DecodeNdarray without a Cast).
  std::optional<DType> dtype;
  /// Unset where even the rank depends on the data; a dimension is -1 where it does
  /// (an image's height and width before a crop).
  std::optional<std::vector<int64_t>> shape;
  /// Image layout, as SampleTensor::channels_first.
  bool channels_first = false;
};

/// Bytes a unit has not read yet: a column of a cache entry file, read only by a window
/// gather, straight into its scratch (see WindowGather). Holds what it needs to read
/// them (an open file) for as long as it lives. Thread-safety: ReadInto may be called
/// concurrently.
class DeferredBytes {
 public:
  virtual ~DeferredBytes() = default;
  virtual int64_t size() const = 0;
  /// Copy all size() bytes to `out`; an error (naming the file) if they cannot be read.
  virtual arrow::Status ReadInto(uint8_t* out) const = 0;
  /// Bytes [offset, offset + length) of these (within size()).
  virtual std::shared_ptr<const DeferredBytes> Slice(int64_t offset, int64_t length) const = 0;
};

/// One column of one decoded unit.
struct ColumnData {
  /// kTensor: num_rows * row_bytes bytes (or, ragged, the bytes `offsets` index).
  /// Variable length: the bytes that offsets index.
  std::shared_ptr<arrow::Buffer> data;
  /// Variable length, and ragged lists: num_rows + 1 int64 byte offsets into data
  /// (need not start at 0). A ragged list row has shape {len, row_shape[1:]...}.
  std::shared_ptr<arrow::Buffer> offsets;
  /// kTensor only: actual shape of one row (row_shape[0] == -1 when ragged), and its
  /// size in bytes (0 when ragged).
  std::vector<int64_t> row_shape;
  int64_t row_bytes = 0;
  /// Per-row samples made by deterministic transforms; when not empty, they replace
  /// the fields above.
  std::vector<SampleTensor> samples;
  /// kTensor, fixed-width rows only: the num_rows * row_bytes bytes not read yet (then
  /// `data` is null). Only units of shuffle windows gathered whole have such columns.
  std::shared_ptr<const DeferredBytes> deferred;
};

/// Small fixed-size columns of a unit stored row by row (see WithRowMajor): row r of
/// column c is at data + r * stride + offset[c].
struct RowMajorBlock {
  std::shared_ptr<arrow::Buffer> data;
  int64_t stride = 0;
  std::vector<int64_t> offset;  ///< Per column; -1 for a column not in the block.
};

/// The decoded columns of one unit, in ColumnSpec order.
struct DecodedUnit {
  int64_t num_rows = 0;
  std::vector<ColumnData> columns;
  /// When set, the columns it holds have no `data` of their own.
  std::shared_ptr<const RowMajorBlock> row_major;
  /// Per row: 0 when a transform failed and on_decode_error="skip" dropped the row.
  /// Empty when every row is valid.
  std::vector<uint8_t> row_ok;
  int64_t skipped_rows = 0;
  /// Its buffers are also an in-memory cache entry's, read again in later epochs: a
  /// batch copies its rows rather than handing out slices of them (the caller may write
  /// into a batch's arrays).
  bool shared = false;
  /// Bytes held by the column buffers.
  int64_t ByteSize() const;
};

/// The dtype and row shape every row of a column has, known before any data.
struct FixedRows {
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  int64_t bytes() const;  ///< Of one row.
};

/// One column of a batch.
struct BatchColumn {
  ColumnKind kind = ColumnKind::kTensor;
  DType dtype = DType::kUInt8;
  /// kTensor: {num_rows, row_shape...}; a ragged tensor column: {total first-dimension
  /// elements, inner...}. Variable length: {num_rows}.
  std::vector<int64_t> shape;
  std::shared_ptr<arrow::Buffer> data;
  /// Variable length: num_rows + 1 int64 byte offsets into data, starting at 0.
  /// A ragged tensor column: num_rows + 1 int64 offsets of its rows along the first
  /// dimension (row i is elements [offsets[i], offsets[i + 1]) of data).
  std::shared_ptr<arrow::Buffer> offsets;
  /// A padded column: each row's valid length (int64, num_rows).
  std::shared_ptr<arrow::Buffer> lengths;
};

struct Batch {
  int64_t epoch = 0;
  int64_t index = 0;  ///< Position of the batch in its epoch.
  int64_t num_rows = 0;
  std::vector<BatchColumn> columns;  ///< In ColumnSpec order.
  /// Bytes allocated for this batch (columns that view a unit's buffers are not counted).
  int64_t owned_bytes = 0;
  int64_t ByteSize() const;
};

/// Check that `unit` (e.g. read from a cache entry) has the layout `specs` describe, so
/// that gathers stay inside its buffers: one column per spec; fixed-size rows of
/// product(row_shape) x dtype size bytes; offsets for variable-length columns.
arrow::Status CheckUnitLayout(const DecodedUnit& unit, const std::vector<ColumnSpec>& specs);

/// Return `unit` with its small fixed-size columns (rows of at most `max_row_bytes`)
/// moved into one row-major block, if it has at least two such columns; else `unit`.
/// A shuffled batch then reads each sample's values from one place (a few cache lines)
/// instead of one cache line per column: the gather of a window larger than the CPU
/// caches is bound by cache misses, not by bytes.
arrow::Result<std::shared_ptr<const DecodedUnit>> WithRowMajor(
    const std::shared_ptr<const DecodedUnit>& unit, int64_t max_row_bytes,
    arrow::MemoryPool* pool);

/// `unit` with its row-major block (if any) copied back into per-column buffers: the
/// layout of units that are gathered column by column. A cache entry written by a
/// shuffled loader is row-major, and an unshuffled loader sharing the cache mixes such
/// hits with its own misses in one batch.
arrow::Result<std::shared_ptr<const DecodedUnit>> WithoutRowMajor(
    const std::shared_ptr<const DecodedUnit>& unit, arrow::MemoryPool* pool);

/// The largest length a padded list column may have (lists=Pad, PadOrTruncate): far above
/// any sequence, and low enough that a batch's size in bytes cannot overflow before the
/// allocation refuses it.
constexpr int64_t kMaxListLength = int64_t{1} << 40;

/// How the rows of a list (or transformed) column whose first dimension varies become
/// one batch column.
struct ColumnCollate {
  enum class Mode : uint8_t {
    kAsIs,    ///< Every row must have one shape: [n, row_shape...].
    kPad,     ///< Padded or truncated to one first dimension: [n, L, inner...] + lengths.
    kRagged,  ///< Rows one after another: [total, inner...] + n + 1 row offsets.
  };
  Mode mode = Mode::kAsIs;
  /// kPad: every row's first dimension; 0 for the longest row of the batch (after
  /// max_length), rounded up to a multiple of multiple_of. Default: 0.
  int64_t length = 0;
  /// kPad with length 0: rows longer than this are truncated. Default: 0, no limit.
  int64_t max_length = 0;
  /// kPad with length 0: the batch's length is a multiple of this. Default: 1.
  int64_t multiple_of = 1;
  /// kPad: the value of padding elements. Default: 0.
  double pad_value = 0;
  /// kPad: padding goes before the values (left), else after. Default: false.
  bool pad_left = false;
  /// kPad: a row too long keeps its last elements (left truncation), else its first.
  bool truncate_left = false;
  /// A stable description, for fingerprints.
  std::string ToString() const;
  /// Refuse lengths outside [0, kMaxListLength] and multiple_of outside [1, kMaxListLength]
  /// (a huge length overflowed the batch's size, and rows were written past its buffer).
  arrow::Status Validate(const std::string& column) const;
};

/// Gather `rows` (RowRef::unit indexes `units` after subtracting `unit_base`) into a
/// new batch. A column c with `samples[c]` non-empty takes row i from samples[c][i]
/// instead (the output of transforms); `samples` may be empty. Fails if one column's
/// rows have different shapes (or dtypes); shapes are compared once per unit.
///
/// Copied columns share one block from `pool`, 64-byte aligned each; when every row
/// comes from one run of consecutive rows of one unit (natural order), fixed-size
/// columns are slices of the unit's buffers instead (no copy). Shuffled rows are
/// gathered with a typed load/store per row for 1/2/4/8/16-byte rows.
///
/// A column with a `collate` mode (collate may be empty: all kAsIs) takes rows of any
/// first dimension and one inner shape: kPad writes them straight into [n, L, inner...]
/// (and BatchColumn::lengths); kRagged one after another (and BatchColumn::offsets),
/// as a slice of the unit when the rows are one run of one unit.
///
/// Without rows (every row of the batch skipped), a column with a `signatures` entry is
/// an empty tensor of its dtype (uint8 where unknown) and row shape (0 for dimensions
/// that depend on the data; no row dimensions where the rank does): [0, row...], padded
/// [0, length, inner...], ragged [0, inner...]. Other columns are as for any batch.
arrow::Result<std::shared_ptr<Batch>> AssembleBatch(
    const std::vector<ColumnSpec>& specs,
    const std::vector<std::shared_ptr<const DecodedUnit>>& units, int64_t unit_base,
    const std::vector<RowRef>& rows, const std::vector<std::vector<SampleTensor>>& samples,
    arrow::MemoryPool* pool, const std::vector<ColumnCollate>& collate = {},
    const std::vector<std::optional<SampleSignature>>& signatures = {});

/// Where AssembleInto writes a batch's rows instead of a block of its own (a
/// mixture's batch: mix/mix_stream.h): per column c, its rows one after another at
/// data[c], row_bytes[c] bytes each, and for a padded column each row's kept length
/// (int64) at lengths[c]. With `dtype` and `row_shape` (optional), each column's rows
/// must also be of that dtype and shape (a padded column's: [length, inner...]).
struct BatchTarget {
  std::vector<uint8_t*> data;
  std::vector<uint8_t*> lengths;
  std::vector<int64_t> row_bytes;
  std::vector<DType> dtype;
  std::vector<std::vector<int64_t>> row_shape;
};

/// AssembleBatch's rows written into `into`. Only for columns of fixed-width rows
/// (numbers, fixed-size lists, transformed samples of one shape, rows padded to a fixed
/// length): InvalidData naming the column if its rows are of another kind, or are not
/// `into.row_bytes` wide (nothing is written past them). A transformed sample already
/// at its row's place in the target (written there by its transforms) is not copied.
/// Needs at least one row.
arrow::Status AssembleInto(
    const std::vector<ColumnSpec>& specs,
    const std::vector<std::shared_ptr<const DecodedUnit>>& units, int64_t unit_base,
    const std::vector<RowRef>& rows, const std::vector<std::vector<SampleTensor>>& samples,
    const BatchTarget& into, const std::vector<ColumnCollate>& collate = {},
    const std::vector<std::optional<SampleSignature>>& signatures = {});

}  // namespace pqloader
