#include "pqloader/dataset/bounded_read.h"

namespace pqloader {

arrow::Result<std::shared_ptr<arrow::Table>> ReadRowGroupBounded(
    parquet::arrow::FileReader* reader, int row_group, const std::vector<int>& leaves,
    int64_t claimed_rows) {
  reader->set_batch_size(kBoundedBatchRows);
  ARROW_ASSIGN_OR_RAISE(auto batch_reader, reader->GetRecordBatchReader({row_group}, leaves));
  std::vector<std::shared_ptr<arrow::RecordBatch>> batches;
  for (int64_t rows = 0; rows <= claimed_rows;) {
    std::shared_ptr<arrow::RecordBatch> batch;
    ARROW_RETURN_NOT_OK(batch_reader->ReadNext(&batch));
    if (batch == nullptr) break;
    rows += batch->num_rows();
    batches.push_back(std::move(batch));
  }
  return arrow::Table::FromRecordBatches(batch_reader->schema(), std::move(batches));
}

}  // namespace pqloader
