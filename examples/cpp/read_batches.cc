// Reads Parquet with libpqloader from C++, as the Python Loader does, and prints one line
// per epoch: its batches and rows, then per column of numbers the sum of its values and
// an order checksum (the sum of each value times its position in the epoch, 1-based, so
// two orders of the same rows differ), per column of strings or bytes their total
// length. The same options and seed give the same lines as pqloader.Loader in Python
// (python/tests/test_cpp_example.py runs both).
//
//   read_batches [--batch-size N] [--shuffle] [--seed S] [--epochs E] [--workers W]
//                [--columns a,b,...] SOURCE...
//
// A SOURCE is a file, a directory or a glob, local or s3://.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <arrow/status.h>

#include "pqloader/api.h"

namespace {

struct Sums {
  double sum = 0;
  double ordered = 0;  // sum of value x position
  int64_t position = 0;  // values seen so far in the epoch
};

// Add a tensor column's elements (in row-major order) to `sums`.
void AddTensor(const pqloader::BatchColumn& column, Sums* sums) {
  const int64_t size = pqloader::DTypeSize(column.dtype);
  const int64_t n = column.data->size() / size;
  for (int64_t i = 0; i < n; ++i) {
    const double v = pqloader::LoadScalar(column.dtype, column.data->data() + i * size);
    sums->sum += v;
    sums->ordered += v * static_cast<double>(++sums->position);
  }
}

arrow::Status Run(const std::vector<std::string>& sources, pqloader::LoaderOptions options,
                  int64_t epochs) {
  ARROW_ASSIGN_OR_RAISE(auto loader, pqloader::Loader::Make(sources, options));
  const std::vector<pqloader::ColumnSpec>& specs = loader->specs();
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    ARROW_RETURN_NOT_OK(loader->StartEpoch(epoch));
    std::vector<Sums> sums(specs.size());
    int64_t batches = 0, rows = 0;
    while (true) {
      ARROW_ASSIGN_OR_RAISE(std::shared_ptr<pqloader::Batch> batch, loader->Next());
      if (batch == nullptr) break;  // the epoch's end
      ++batches;
      rows += batch->num_rows;
      for (size_t c = 0; c < batch->columns.size(); ++c) {
        const pqloader::BatchColumn& column = batch->columns[c];
        if (column.kind == pqloader::ColumnKind::kTensor) {
          AddTensor(column, &sums[c]);
        } else {
          sums[c].sum += static_cast<double>(column.data->size());  // the rows' bytes
        }
      }
    }
    std::cout << "epoch " << epoch << " batches " << batches << " rows " << rows;
    for (size_t c = 0; c < specs.size(); ++c) {
      char text[96];
      if (specs[c].kind == pqloader::ColumnKind::kTensor) {
        std::snprintf(text, sizeof(text), "%.17g/%.17g", sums[c].sum, sums[c].ordered);
      } else {
        std::snprintf(text, sizeof(text), "%.17g", sums[c].sum);
      }
      std::cout << " " << specs[c].name << "=" << text;
    }
    std::cout << "\n";
  }
  return arrow::Status::OK();
}

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    if (end > begin) parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

}  // namespace

int main(int argc, char** argv) {
  pqloader::LoaderOptions options;
  options.plan.batch_size = 1024;
  int64_t epochs = 1;
  std::vector<std::string> sources;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--shuffle") {
      options.plan.shuffle = true;
    } else if (arg == "--batch-size" && has_value) {
      options.plan.batch_size = std::atoll(argv[++i]);
    } else if (arg == "--seed" && has_value) {
      options.plan.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--epochs" && has_value) {
      epochs = std::atoll(argv[++i]);
    } else if (arg == "--workers" && has_value) {
      options.num_workers = std::atoi(argv[++i]);
    } else if (arg == "--columns" && has_value) {
      options.dataset.columns.columns = SplitCommas(argv[++i]);
    } else if (arg.rfind("--", 0) == 0) {
      std::cerr << "read_batches: unknown option or missing value: " << arg << "\n";
      return 2;
    } else {
      sources.push_back(arg);
    }
  }
  if (sources.empty()) {
    std::cerr << "usage: read_batches [--batch-size N] [--shuffle] [--seed S] [--epochs E] "
                 "[--workers W] [--columns a,b] SOURCE...\n";
    return 2;
  }
  const arrow::Status status = Run(sources, options, epochs);
  if (!status.ok()) {
    std::cerr << "read_batches: " << status.ToString() << "\n";
    return 1;
  }
  return 0;
}
