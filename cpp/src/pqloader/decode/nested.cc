#include "pqloader/decode/nested.h"

#include <cstring>

#include <arrow/extension_type.h>

#include "pqloader/error.h"

namespace pqloader {

namespace {

arrow::Result<std::shared_ptr<arrow::Array>> StructField(const arrow::StructArray& st,
                                                         const std::string& name,
                                                         arrow::MemoryPool* pool) {
  const int i = st.struct_type()->GetFieldIndex(name);
  if (i < 0) {
    return arrow::Status::Invalid("no field '", name, "' in ", st.type()->ToString());
  }
  return st.GetFlattenedField(i, pool);
}

// A list array like `list` whose values are `values` (the same length as its values).
std::shared_ptr<arrow::Array> WithValues(const arrow::Array& list,
                                         const std::shared_ptr<arrow::Array>& values) {
  std::shared_ptr<arrow::DataType> type;
  switch (list.type_id()) {
    case arrow::Type::LARGE_LIST: type = arrow::large_list(values->type()); break;
    case arrow::Type::FIXED_SIZE_LIST:
      type = arrow::fixed_size_list(
          values->type(), static_cast<const arrow::FixedSizeListType&>(*list.type()).list_size());
      break;
    default: type = arrow::list(values->type()); break;  // list, map
  }
  auto data = list.data()->Copy();
  data->type = type;
  data->child_data = {values->data()};
  return arrow::MakeArray(data);
}

}  // namespace

arrow::Result<std::shared_ptr<arrow::Array>> ExtractPath(std::shared_ptr<arrow::Array> array,
                                                         const std::vector<std::string>& path,
                                                         arrow::MemoryPool* pool) {
  for (const std::string& name : path) {
    if (array->type_id() == arrow::Type::EXTENSION) {  // a field read whole as its extension type
      array = static_cast<const arrow::ExtensionArray&>(*array).storage();
    }
    switch (array->type_id()) {
      case arrow::Type::STRUCT: {
        ARROW_ASSIGN_OR_RAISE(array,
                              StructField(static_cast<const arrow::StructArray&>(*array), name, pool));
        break;
      }
      case arrow::Type::LIST: case arrow::Type::LARGE_LIST: case arrow::Type::FIXED_SIZE_LIST:
      case arrow::Type::MAP: {
        const std::shared_ptr<arrow::Array> values =
            array->type_id() == arrow::Type::LARGE_LIST
                ? static_cast<const arrow::LargeListArray&>(*array).values()
            : array->type_id() == arrow::Type::FIXED_SIZE_LIST
                ? static_cast<const arrow::FixedSizeListArray&>(*array).values()
                : static_cast<const arrow::ListArray&>(*array).values();
        if (values->type_id() != arrow::Type::STRUCT) {
          return arrow::Status::Invalid("no field '", name, "' below ", array->type()->ToString());
        }
        ARROW_ASSIGN_OR_RAISE(auto field, StructField(static_cast<const arrow::StructArray&>(*values),
                                                      name, pool));
        array = WithValues(*array, field);
        break;
      }
      default:
        return arrow::Status::Invalid("no field '", name, "' below ", array->type()->ToString());
    }
  }
  return array;
}

arrow::Result<ColumnData> ValidityColumn(const arrow::ChunkedArray& array,
                                         arrow::MemoryPool* pool) {
  ColumnData out;
  ARROW_ASSIGN_OR_RAISE(auto data, arrow::AllocateBuffer(array.length(), pool));
  uint8_t* p = data->mutable_data();
  for (const auto& chunk : array.chunks()) {
    const int64_t n = chunk->length();
    if (chunk->null_count() == 0) {
      std::memset(p, 1, n);
    } else {
      for (int64_t r = 0; r < n; ++r) p[r] = chunk->IsValid(r) ? 1 : 0;
    }
    p += n;
  }
  out.data = std::move(data);
  out.row_bytes = 1;
  return out;
}

arrow::Result<ColumnData> ConstantValidity(int64_t rows, bool valid, arrow::MemoryPool* pool) {
  ColumnData out;
  ARROW_ASSIGN_OR_RAISE(auto data, arrow::AllocateBuffer(rows, pool));
  std::memset(data->mutable_data(), valid ? 1 : 0, rows);
  out.data = std::move(data);
  out.row_bytes = 1;
  return out;
}

}  // namespace pqloader
