#include "pqloader/dataset/columns.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include <arrow/type_traits.h>
#include <arrow/util/key_value_metadata.h>

#include "pqloader/dataset/hive.h"
#include "pqloader/error.h"

namespace pqloader {

namespace {

// The struct a step of a dotted path goes into: the type itself, or the values of a
// list (or map) of structs. Null when the step cannot go below `type`.
const arrow::StructType* StructBelow(const arrow::DataType& type, bool* through_list) {
  *through_list = false;
  const arrow::DataType* t = &type;
  if (t->id() == arrow::Type::LIST || t->id() == arrow::Type::LARGE_LIST ||
      t->id() == arrow::Type::FIXED_SIZE_LIST || t->id() == arrow::Type::MAP) {
    *through_list = true;
    t = static_cast<const arrow::BaseListType*>(t)->value_type().get();
  }
  return t->id() == arrow::Type::STRUCT ? static_cast<const arrow::StructType*>(t) : nullptr;
}

// The type of `path` below `type` (a list step makes the result a list of it), and
// whether a null can appear on the way. Null when the path does not exist.
std::shared_ptr<arrow::DataType> TypeAt(std::shared_ptr<arrow::DataType> type,
                                        const std::vector<std::string>& path, bool* nullable) {
  for (const std::string& name : path) {
    bool through_list = false;
    const arrow::StructType* st = StructBelow(*type, &through_list);
    if (st == nullptr) return nullptr;
    const int i = st->GetFieldIndex(name);
    if (i < 0) return nullptr;
    *nullable = *nullable || st->field(i)->nullable();
    auto child = st->field(i)->type();
    if (through_list) {  // the list kept (a fixed size too: its field's rows are tensors)
      switch (type->id()) {
        case arrow::Type::LARGE_LIST:
          type = arrow::large_list(child);
          break;
        case arrow::Type::FIXED_SIZE_LIST:
          type = arrow::fixed_size_list(
              child, static_cast<const arrow::FixedSizeListType&>(*type).list_size());
          break;
        default:  // a list, or a map's entries
          type = arrow::list(child);
          break;
      }
    } else {
      type = child;
    }
  }
  return type;
}

// The Parquet leaves below `path` of manifest field `field`.
bool LeavesAt(const parquet::arrow::SchemaField& field, const std::vector<std::string>& path,
              size_t step, std::vector<int>* out) {
  if (step == path.size()) {
    std::vector<const parquet::arrow::SchemaField*> stack{&field};
    while (!stack.empty()) {
      const auto* f = stack.back();
      stack.pop_back();
      if (f->column_index >= 0) out->push_back(f->column_index);
      for (auto it = f->children.rbegin(); it != f->children.rend(); ++it) stack.push_back(&*it);
    }
    return true;
  }
  const parquet::arrow::SchemaField* node = &field;
  // (an extension type's field by its storage: pandas' interval, struct<left, right>)
  if (TypeWithoutExtension(node->field->type())->id() != arrow::Type::STRUCT) {  // a list or map of structs
    if (node->children.size() != 1) return false;
    node = &node->children[0];
  }
  for (const auto& child : node->children) {
    if (child.field->name() == path[step]) return LeavesAt(child, path, step + 1, out);
  }
  return false;
}

// Where `a` and `b` are times of one kind (timestamp, duration, time) in different units
// or time zones: why neither converts (they load as integers in the stored unit, so a
// declared schema cannot convert them either); "" otherwise.
std::string UnitsDiffer(const arrow::DataType& a, const arrow::DataType& b) {
  if (arrow::is_list_like(a.id()) && arrow::is_list_like(b.id()) && a.num_fields() == 1 &&
      b.num_fields() == 1) {  // lists of times: their values
    return UnitsDiffer(*a.field(0)->type(), *b.field(0)->type());
  }
  // (time32 and time64 are one kind of time in other units)
  const auto kind = [](arrow::Type::type id) {
    return id == arrow::Type::TIME64 ? arrow::Type::TIME32 : id;
  };
  const bool times = kind(a.id()) == kind(b.id()) && (a.id() == arrow::Type::TIMESTAMP ||
                                          a.id() == arrow::Type::DURATION ||
                                          a.id() == arrow::Type::TIME32 ||
                                          a.id() == arrow::Type::TIME64);
  if (!times || a.Equals(b)) return "";
  if (a.id() == arrow::Type::TIMESTAMP) {
    const auto& ta = static_cast<const arrow::TimestampType&>(a);
    const auto& tb = static_cast<const arrow::TimestampType&>(b);
    if (ta.unit() == tb.unit()) {  // one unit: the zones differ (INT96 and local times have none)
      return "timestamps of different time zones ('" + ta.timezone() + "' and '" + tb.timezone() +
             "', '' for none: INT96 and local times) are refused rather than converted (they "
             "load as integers in the stored unit): write the files with one time zone, or "
             "select other columns";
    }
  }
  return "times in different units or time zones are refused rather than converted (they load as "
         "integers in the stored unit): write the files in one unit, or select other columns";
}

// The scale of the decimals `type` holds (itself, or the values of its lists, at any
// depth), or -1 when it holds none.
int32_t DecimalScale(const arrow::DataType& type) {
  if (arrow::is_decimal(type.id())) return static_cast<const arrow::DecimalType&>(type).scale();
  if (arrow::is_list_like(type.id()) && type.num_fields() == 1) {
    return DecimalScale(*type.field(0)->type());
  }
  return -1;
}

// The names of `wanted` that ask for column `name`: itself, or a struct above it (`name`
// cut before one of its '.'). Looked up, not compared with every name (20,000 columns
// under a null_mask list of theirs took 9 s).
std::vector<std::string> NamesAsking(const std::set<std::string>& wanted, const std::string& name) {
  std::vector<std::string> out;
  for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) {
    if (auto it = wanted.find(name.substr(0, dot)); it != wanted.end()) out.push_back(*it);
  }
  if (wanted.count(name) > 0) out.push_back(name);
  return out;
}

std::string Join(const std::string& top, const std::vector<std::string>& path) {
  std::string out = top;
  for (const auto& p : path) out += "." + p;
  return out;
}

// One output column before specs: its top-level field name and the path below it.
struct Leaf {
  std::string top;
  std::vector<std::string> path;
  /// The declared field, when the declared schema names a struct's leaf by its dotted
  /// path (as a loader's arrow_schema does): its type is the leaf's.
  std::string declared;
  std::string name() const { return Join(top, path); }
};

class Resolver {
 public:
  Resolver(const std::vector<FileColumns>& files, const std::vector<PartitionKey>& keys,
           const ColumnsOptions& options)
      : files_(files), keys_(keys), options_(options),
        null_mask_names_(options.null_mask_columns.begin(), options.null_mask_columns.end()) {}

  arrow::Result<ResolvedColumns> Run() {
    std::vector<std::string> names = options_.columns;
    if (names.empty()) names = DefaultNames();
    std::map<std::string, Leaf> seen;  // output name -> where it comes from
    // Which files the two are in (the message named none).
    auto where = [&](const Leaf& a, const Leaf& b) {
      const std::string wa = WhereIs(a), wb = WhereIs(b);
      return wa == wb ? " (" + wa + " has both; "
                      : " (" + wa + " has the first, " + wb + " the second; ";
    };
    const std::string key_where =
        files_.empty() ? std::string() : " (as in the path of '" + Quoted(files_[0].display) + "')";
    for (size_t k = 0; k < keys_.size(); ++k) {
      out_.key_loads.push_back(KeyIndex(keys_[k].name) == static_cast<int>(k) ? LoadOfKey(k)
                                                                                : KeyLoad::kFiles);
      out_.key_errors.push_back(
          KeyIndex(keys_[k].name) != static_cast<int>(k) ? arrow::Status::OK()
          : out_.key_loads[k] == KeyLoad::kFiles         ? CheckKeyInEveryFile(k)
                                                         : CheckDeclaredIntegerKey(k));
    }
    std::set<std::string> key_columns;  // partition keys loaded from the paths
    for (const std::string& name : names) {
      const int key = KeyIndex(name);
      if (key >= 0) ARROW_RETURN_NOT_OK(out_.key_errors[key]);  // selected (or a filter's: row_filter.cc)
      if (key >= 0 && out_.key_loads[key] != KeyLoad::kFiles) {
        // A struct's leaf of the key's dotted name ("a.b" of struct a beside a path's
        // a.b=1/): both were output columns 'a.b', and the batch's dict kept one.
        if (const auto it = seen.find(name); it != seen.end()) {
          return arrow::Status::Invalid(
              "two columns would be named '", Quoted(name), "': partition key '", Quoted(name),
              "' of the paths", key_where, " and ", Origin(it->second), " (in ",
              WhereIs(it->second), "; a struct's fields are named by dotted path); select one "
              "of them with columns=");
        }
        key_columns.insert(name);
        ARROW_RETURN_NOT_OK(CheckPartitionUtf8(key));
        ARROW_RETURN_NOT_OK(AddPartition(name, key));
        continue;
      }
      ARROW_ASSIGN_OR_RAISE(auto leaf, Locate(name));
      std::vector<Leaf> leaves;
      ARROW_RETURN_NOT_OK(Expand(leaf, &leaves));
      for (const Leaf& l : leaves) {
        if (key_columns.count(l.name()) > 0) {
          return arrow::Status::Invalid(
              "two columns would be named '", Quoted(l.name()), "': partition key '",
              Quoted(l.name()), "' of the paths", key_where, " and ", Origin(l), " (in ",
              WhereIs(l), "; a struct's fields are named by dotted path); select one of them "
              "with columns=");
        }
        const auto [it, added] = seen.emplace(l.name(), l);
        if (!added && (it->second.top != l.top || it->second.path != l.path)) {
          return arrow::Status::Invalid(
              "two columns would be named '", Quoted(l.name()), "': ", Origin(it->second),
              " and ", Origin(l), where(it->second, l), "a struct's fields are named by dotted "
              "path); ", it->second.top == l.top ? "rename one of the fields in the files, or "
              "select other columns" : "select one of them with columns=");
        }
        if (!added) {
          return arrow::Status::Invalid("column '", Quoted(l.name()), "' is selected twice (",
                                        "columns= names it, or a struct that holds it, more "
                                        "than once)");
        }
        ARROW_RETURN_NOT_OK(CheckNameUtf8(l));
        ARROW_RETURN_NOT_OK(AddLeaf(l));
      }
    }
    ARROW_RETURN_NOT_OK(AddMasks());
    return std::move(out_);
  }

 private:
  static std::string Origin(const Leaf& l) {
    if (l.path.empty()) return "the column '" + Quoted(l.top) + "'";
    return "field '" + Quoted(l.path.back()) + "' of struct '" +
           Quoted(Join(l.top, std::vector<std::string>(l.path.begin(), l.path.end() - 1))) + "'";
  }

  // Where `leaf` is, quoted: the first file that has it, or the declared schema.
  std::string WhereIs(const Leaf& leaf) const {
    for (size_t f = 0; f < files_.size(); ++f) {
      bool nullable = false;
      if (TypeIn(static_cast<int>(f), leaf, &nullable) != nullptr) {
        return "'" + Quoted(files_[f].display) + "'";
      }
    }
    return "the declared schema";
  }

  // Every field path below `type` that `rest` spells (field names joined by '.', where a
  // name may itself hold a '.'), each after `path`, into `out`. Walks as TypeAt does.
  static void PathsSpelled(const std::shared_ptr<arrow::DataType>& type, const std::string& rest,
                           std::vector<std::string>* path,
                           std::set<std::vector<std::string>>* out) {
    bool through_list = false;
    const arrow::StructType* st = StructBelow(*type, &through_list);
    if (st == nullptr) return;
    std::set<std::string> tried;  // two fields of one name: one spelling (refused later)
    for (const auto& child : st->fields()) {
      const std::string& n = child->name();
      if (!tried.insert(n).second || rest.compare(0, n.size(), n) != 0) continue;
      if (rest.size() == n.size()) {
        path->push_back(n);
        out->insert(*path);
        path->pop_back();
      } else if (rest[n.size()] == '.') {
        path->push_back(n);
        auto below = !through_list ? child->type()
                     : type->id() == arrow::Type::LARGE_LIST ? arrow::large_list(child->type())
                                                             : arrow::list(child->type());
        PathsSpelled(below, rest.substr(n.size() + 1), path, out);
        path->pop_back();
      }
    }
  }

  // Whether `rest` spells a field below `type` when lists of lists are followed too:
  // `lists` counts the lists entered above; `*first` and `*second` get the dotted names of
  // the fields whose lists were the first and the second on the way (the second is what
  // PathsSpelled does not go below; a list of lists is both at one field).
  static bool SpelledBelowTwoLists(const arrow::DataType& type, const std::string& rest,
                                   const std::string& at, int lists, std::string* first,
                                   std::string* second) {
    const arrow::DataType* t = &type;
    while (t->id() == arrow::Type::LIST || t->id() == arrow::Type::LARGE_LIST ||
           t->id() == arrow::Type::FIXED_SIZE_LIST || t->id() == arrow::Type::MAP) {
      ++lists;
      if (lists == 1) *first = at;
      if (lists == 2) *second = at;
      t = static_cast<const arrow::BaseListType*>(t)->value_type().get();
    }
    if (t->id() != arrow::Type::STRUCT) return false;
    for (const auto& child : t->fields()) {
      const std::string& n = child->name();
      if (rest.compare(0, n.size(), n) != 0) continue;
      if (rest.size() == n.size() && lists >= 2) return true;
      if (rest.size() > n.size() && rest[n.size()] == '.') {
        std::string inner_first = *first, inner_second = *second;
        if (SpelledBelowTwoLists(*child->type(), rest.substr(n.size() + 1), at + "." + n, lists,
                                 &inner_first, &inner_second)) {
          *first = inner_first;
          *second = inner_second;
          return true;
        }
      }
    }
    return false;
  }

  // A name no spelling resolves that names a field below two lists: refused as such,
  // not as a column that does not exist.
  arrow::Status CheckBelowTwoLists(const std::string& name) const {
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) {
      const std::string top = name.substr(0, dot);
      for (int f = options_.schema != nullptr ? -1 : 0; f < static_cast<int>(files_.size()); ++f) {
        const auto& schema = f < 0 ? options_.schema : files_[f].schema;
        for (int i : schema->GetAllFieldIndices(top)) {
          std::string first, second;
          if (SpelledBelowTwoLists(*schema->field(i)->type(), name.substr(dot + 1), top, 0,
                                   &first, &second)) {
            return MakeError(ErrorKind::kUnsupportedType, "column '", Quoted(name),
                             "' is a field below two lists (",
                             first == second ? "a list of lists at '" + Quoted(first) + "'"
                                             : "of '" + Quoted(first) + "' and of '" +
                                                   Quoted(second) + "'",
                             ", in ",
                             f < 0 ? std::string("the declared schema")
                                   : "'" + Quoted(files_[f].display) + "'",
                             "), which is not supported: a dotted path may go below one list "
                             "of structs only (a list of lists needs one length per inner list); "
                             "select other columns with columns=[...]");
          }
        }
        if (f < 0) break;  // declared: the schema decides
      }
    }
    return arrow::Status::OK();
  }

  // Every (top-level field, path below it) that the dotted `name` spells in the declared
  // schema (or, where `files_only` or none is declared, in the files), with where the
  // first of each is.
  std::vector<std::pair<Leaf, std::string>> Spellings(const std::string& name,
                                                      bool files_only) const {
    std::vector<std::pair<Leaf, std::string>> out;
    const bool declared = options_.schema != nullptr && !files_only;
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) {
      const std::string top = name.substr(0, dot);
      if (declared ? !IsTopField(top) : !InAnyFile(top)) continue;
      for (int f = declared ? -1 : 0; f < static_cast<int>(files_.size()); ++f) {
        const auto& schema = f < 0 ? options_.schema : files_[f].schema;
        for (int i : schema->GetAllFieldIndices(top)) {
          std::set<std::vector<std::string>> paths;
          std::vector<std::string> path;
          PathsSpelled(schema->field(i)->type(), name.substr(dot + 1), &path, &paths);
          for (const auto& p : paths) {
            bool known = false;
            for (const auto& [l, w] : out) known = known || (l.top == top && l.path == p);
            if (known) continue;
            std::string where = "'";  // (appended: GCC 12 saw an overflow in "'" + ...)
            where += Quoted(FileName(f));
            where += "'";
            out.push_back({Leaf{top, p, {}}, std::move(where)});
          }
        }
        if (f < 0) break;  // declared: the schema decides
      }
    }
    return out;
  }

  static arrow::Status Ambiguous(const std::string& name,
                                 const std::vector<std::pair<Leaf, std::string>>& spellings,
                                 const std::string& top_in, const std::string& remedy) {
    std::string which = top_in.empty() ? "" : "the column '" + Quoted(name) + "' (in " + top_in + ")";
    for (const auto& [l, w] : spellings) {
      which += (which.empty() ? "" : " and ") + Origin(l) + " (in " + w + ")";
    }
    return MakeError(ErrorKind::kInvalidData, "column '", Quoted(name), "' is ambiguous: it names ",
                     which, " (a struct's fields are named by dotted path, and a name may hold "
                     "a '.'); ", remedy);
  }

  // Selected names and partition values become Python str: they must be valid UTF-8
  // (an unselected column's name may be anything).
  arrow::Status CheckNameUtf8(const Leaf& leaf) const {
    const std::string name = leaf.name();
    if (IsValidUtf8(name)) return arrow::Status::OK();
    std::string where = files_.empty() ? std::string("the declared schema") : files_[0].display;
    for (size_t f = 0; f < files_.size(); ++f) {
      bool nullable = false;
      if (TypeIn(static_cast<int>(f), leaf, &nullable) != nullptr) {
        where = files_[f].display;
        break;
      }
    }
    return MakeError(ErrorKind::kInvalidData, "'", where, "' has a column named b'",
                     Printable(name), "', which is not valid UTF-8; select other columns with "
                     "columns=[...]");
  }

  arrow::Status CheckPartitionUtf8(int key) const {
    const PartitionKey& k = keys_[key];
    if (!IsValidUtf8(k.name)) {
      return MakeError(ErrorKind::kInvalidData, "the path of '", Printable(files_[0].display),
                       "' has a partition key named b'", Printable(k.name),
                       "', which is not valid UTF-8; select other columns with columns=[...]");
    }
    for (size_t f = 0; f < k.values.size(); ++f) {
      if (!k.null[f] && !IsValidUtf8(k.values[f])) {
        return MakeError(ErrorKind::kInvalidData, "the path of '", Printable(files_[f].display),
                         "' gives partition key '", k.name, "' a value that is not valid "
                         "UTF-8 (b'", Printable(k.values[f]), "')");
      }
    }
    return arrow::Status::OK();
  }

  // A name as error messages quote it: escaped where it is not valid UTF-8.
  static std::string Quoted(const std::string& name) {
    return IsValidUtf8(name) ? name : Printable(name);
  }

  int KeyIndex(const std::string& name) const {
    for (size_t k = 0; k < keys_.size(); ++k) {
      if (keys_[k].name == name) return static_cast<int>(k);
    }
    return -1;
  }

  bool InAnyFile(const std::string& name) const {
    for (const auto& f : files_) {
      if (!f.schema->GetAllFieldIndices(name).empty()) return true;
    }
    return false;
  }

  bool IsTopField(const std::string& name) const {
    // GetFieldIndex is -1 for a name two fields share: such a column is found here,
    // and refused by AddLeaf.
    if (options_.schema != nullptr) return !options_.schema->GetAllFieldIndices(name).empty();
    return InAnyFile(name);
  }

  // A column that two top-level fields of a file (or of the declared schema) are named:
  // which one is meant is ambiguous (Arrow finds neither by name; the file would read as
  // lacking it).
  arrow::Status CheckOneFieldNamed(const std::string& top) const {
    auto check = [&](const arrow::Schema& schema, const std::string& where) -> arrow::Status {
      const size_t n = schema.GetAllFieldIndices(top).size();
      if (n <= 1) return arrow::Status::OK();
      return MakeError(ErrorKind::kInvalidData, where, " has ", n, " columns named '", top,
                       "': which one to read is ambiguous; select other columns with "
                       "columns=[...]");
    };
    if (options_.schema != nullptr) ARROW_RETURN_NOT_OK(check(*options_.schema, "the declared schema"));
    for (const auto& f : files_) ARROW_RETURN_NOT_OK(check(*f.schema, "'" + f.display + "'"));
    return arrow::Status::OK();
  }

  // A struct on `leaf`'s path in file f (the declared schema where f < 0) with two fields
  // of one name: which one is meant is ambiguous. GetFieldIndex finds neither, so the
  // file read as lacking the leaf (its rows null, or fill_null's value, where another
  // file has it), and a leaf that no file had left the column without a type (a crash).
  // Where `leaf`'s path in file f crosses a field that is neither a struct (nor a list or
  // map of structs) nor all null: that field's dotted name and type; false where the path
  // is walkable or merely ends early (a struct lacking the field: null rows, as pyarrow).
  // TypeAt gives null for both, and a file's int64 x read as lacking x.a: its values
  // became nulls or fill_null's.
  bool NonStructOnPath(int f, const Leaf& leaf, std::string* where,
                       std::shared_ptr<arrow::DataType>* what) const {
    auto field = files_[f].schema->GetFieldByName(leaf.top);
    if (field == nullptr || leaf.path.empty()) return false;
    auto type = field->type();
    std::vector<std::string> walked;
    for (const std::string& name : leaf.path) {
      if (type->id() == arrow::Type::NA) return false;  // all null: absent, as before
      bool through_list = false;
      const arrow::StructType* st = StructBelow(*type, &through_list);
      if (st == nullptr) {
        *where = Join(leaf.top, walked);
        *what = type;
        return true;
      }
      const int i = st->GetFieldIndex(name);
      if (i < 0) return false;
      walked.push_back(name);
      type = st->field(i)->type();
    }
    return false;
  }

  arrow::Status CheckOneFieldOnPath(int f, const Leaf& leaf) const {
    const auto& schema = f < 0 ? options_.schema : files_[f].schema;
    if (schema == nullptr || leaf.path.empty()) return arrow::Status::OK();
    auto field = schema->GetFieldByName(leaf.top);
    if (field == nullptr) return arrow::Status::OK();
    auto type = field->type();
    std::vector<std::string> walked;
    for (const std::string& name : leaf.path) {
      bool through_list = false;
      const arrow::StructType* st = StructBelow(*type, &through_list);
      if (st == nullptr) return arrow::Status::OK();
      const std::vector<int> all = st->GetAllFieldIndices(name);
      if (all.size() > 1) {
        return MakeError(ErrorKind::kInvalidData, f < 0 ? std::string("the declared schema")
                                                        : "'" + files_[f].display + "'",
                         " has ", all.size(), " fields named '", Quoted(name), "' in struct '",
                         Quoted(Join(leaf.top, walked)), "': which one to read as column '",
                         Quoted(leaf.name()), "' is ambiguous; select other columns with "
                         "columns=[...]");
      }
      if (all.empty()) return arrow::Status::OK();
      walked.push_back(name);
      type = st->field(all[0])->type();
    }
    return arrow::Status::OK();
  }

  // Every column of every file in order of first appearance (or the declared schema's),
  // without pandas index columns, then the partition keys that are not file columns.
  std::vector<std::string> DefaultNames() const {
    std::vector<std::string> names;
    std::set<std::string> seen;
    // A pandas index column is left out only where no file stores it as data: one file's
    // df.set_index("id") beside files whose "id" is a plain column dropped it from them
    // all. A declared field is selected, never left out.
    PandasIndexes indexes;
    for (const auto& f : files_) indexes.Add(*f.schema, f.metadata.get());
    auto add = [&](const std::string& n, bool declared) {
      if ((declared || !indexes.LeftOut(n)) && seen.insert(n).second) names.push_back(n);
    };
    if (options_.schema != nullptr) {
      for (const auto& field : options_.schema->fields()) {
        if (!IsMaskNullMaskAdds(field->name())) add(field->name(), /*declared=*/true);
      }
    } else {
      for (const auto& f : files_) {
        for (const auto& field : f.schema->fields()) add(field->name(), /*declared=*/false);
      }
    }
    for (const auto& k : keys_) {
      if (seen.insert(k.name).second) names.push_back(k.name);
    }
    return names;
  }

  // Whether a declared field `name` is the "<column>_valid" mask that null_mask= adds
  // (a loader's arrow_schema lists its masks): a bool no file stores, beside its
  // declared column.
  bool IsMaskNullMaskAdds(const std::string& name) const {
    static constexpr std::string_view kSuffix = "_valid";
    if (name.size() <= kSuffix.size() ||
        name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) {
      return false;
    }
    const std::string column = name.substr(0, name.size() - kSuffix.size());
    auto field = options_.schema->GetFieldByName(name);
    if (field == nullptr || field->type()->id() != arrow::Type::BOOL || InAnyFile(name) ||
        options_.schema->GetFieldByName(column) == nullptr) {
      return false;
    }
    return options_.null_mask_all || !NamesAsking(null_mask_names_, column).empty();
  }

  // The type of (top, path) in file i (or declared), null where absent.
  std::shared_ptr<arrow::DataType> TypeIn(int file, const Leaf& leaf, bool* nullable) const {
    std::shared_ptr<arrow::Field> field;
    if (file < 0 && !leaf.declared.empty()) {
      field = options_.schema->GetFieldByName(leaf.declared);
      if (field == nullptr) return nullptr;
      *nullable = field->nullable();
      return field->type();
    } else if (file < 0) {
      field = options_.schema->GetFieldByName(leaf.top);
    } else {
      field = files_[file].schema->GetFieldByName(leaf.top);
    }
    if (field == nullptr) return nullptr;
    *nullable = field->nullable();
    return TypeAt(field->type(), leaf.path, nullable);
  }

  // Find `name` as a top-level field, or as a dotted path below one (the longest
  // top-level name that prefixes it).
  arrow::Result<Leaf> Locate(const std::string& name) const {
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', start)) {
      parts.push_back(name.substr(start, dot - start));
      start = dot + 1;
    }
    parts.push_back(name.substr(start));
    if (IsTopField(name)) {
      // A declared "st.a" that no file has at the top: the leaf a of struct st in the
      // files (a loader's arrow_schema names struct leaves so), of the declared type.
      const auto declared = options_.schema ? options_.schema->GetFieldByName(name) : nullptr;
      if (declared != nullptr && parts.size() > 1 &&
          declared->type()->id() != arrow::Type::STRUCT) {
        // A loader's arrow_schema says which leaf it lists (DecodeLeafPath).
        Leaf marked;
        if (declared->metadata() != nullptr &&
            DecodeLeafPath(declared->metadata(), &marked.top, &marked.path) &&
            marked.name() == name && InAnyFile(marked.top)) {
          if (marked.path.empty()) return Leaf{name, {}, {}};  // the top-level 'a.b'
          marked.declared = name;
          return marked;
        }
        if (InAnyFile(name)) {
          // A top-level 'a.b' of the files beside a struct a{b}: a loader that selected
          // the struct lists its leaf 'a.b', and a schema rebuilt from it read the other.
          const auto leaves = Spellings(name, /*files_only=*/true);
          if (!leaves.empty()) {
            std::string top_in;
            for (const auto& f : files_) {
              if (!f.schema->GetAllFieldIndices(name).empty()) {
                top_in = "'" + Quoted(f.display) + "'";
                break;
              }
            }
            return Ambiguous(name, leaves, top_in,
                             "declare it with the schema of a loader that selected the one "
                             "to load (its arrow_schema marks which), or rename one in the files");
          }
        }
      }
      if (declared != nullptr && parts.size() > 1 && !InAnyFile(name) &&
          declared->type()->id() != arrow::Type::STRUCT) {
        for (size_t k = parts.size() - 1; k >= 1; --k) {
          std::string top = parts[0];
          for (size_t i = 1; i < k; ++i) top += "." + parts[i];
          if (!InAnyFile(top)) continue;
          Leaf leaf{top, std::vector<std::string>(parts.begin() + k, parts.end()), name};
          for (size_t f = 0; f < files_.size(); ++f) {
            bool nullable = false;
            if (TypeIn(static_cast<int>(f), leaf, &nullable) != nullptr) return leaf;
          }
        }
      }
      return Leaf{name, {}, {}};
    }
    // Every way the name splits into a top-level field and fields below it: a struct a
    // with a field 'b.c' beside a field b{c} (or a top-level 'a.b' beside a struct a{b.c})
    // spells 'a.b.c' twice, and the longest top-level prefix was taken silently.
    const auto spellings = Spellings(name, /*files_only=*/false);
    if (spellings.size() > 1) {
      return Ambiguous(name, spellings, "", "rename one of them in the files, or select other "
                       "columns");
    }
    if (spellings.size() == 1) {
      const Leaf& leaf = spellings[0].first;
      for (int f = options_.schema != nullptr ? -1 : 0; f < static_cast<int>(files_.size()); ++f) {
        ARROW_RETURN_NOT_OK(CheckOneFieldOnPath(f, leaf));
        if (f < 0) break;  // declared: the schema decides
      }
      return leaf;
    }
    ARROW_RETURN_NOT_OK(CheckBelowTwoLists(name));
    // The first 50 names (a wide file's every name made a message of 63 KB at 8,000).
    constexpr size_t kListed = 50;
    std::string available;
    size_t more = 0;
    // The declared schema's, else every file's columns (the first file's alone left out a
    // column that later files added, beside "does not exist in ... or any other file").
    arrow::FieldVector fields;
    std::set<std::string> names;
    for (size_t f = 0; f < (options_.schema != nullptr ? 1 : files_.size()); ++f) {
      const auto& schema = options_.schema != nullptr ? options_.schema : files_[f].schema;
      for (const auto& field : schema->fields()) {
        if (names.insert(field->name()).second) fields.push_back(field);
      }
    }
    size_t listed = 0;
    auto add = [&](const std::string& text) {
      if (listed++ < kListed) {
        available += text;
      } else {
        ++more;
      }
    };
    for (const auto& field : fields) {
      // Where dotted fields are below it: a struct's, a list of structs' or a map's.
      bool through_list = false;
      const std::string quoted = Quoted(field->name());
      const bool has_fields = StructBelow(*field->type(), &through_list) != nullptr;
      add(" '" + quoted + "'" +
          (!has_fields ? std::string()
           : field->type()->id() == arrow::Type::MAP
               ? " (a map: '" + quoted + ".key', '" + quoted + ".value')"
           : through_list ? " (a list of structs: '" + quoted + ".<field>')"
                          : " (a struct: '" + quoted + ".<field>')"));
    }
    // (a key the schema or a file has too is listed once: 'k' 'k' read as two)
    for (const auto& k : keys_) {
      if (names.count(k.name) == 0) add(" '" + Quoted(k.name) + "'");
    }
    if (more > 0) {
      available += " ... and " + std::to_string(more) + " more (loader.column_info and `pqloader "
                   "inspect` list them)";
    }
    if (options_.schema != nullptr) {
      return MakeError(ErrorKind::kColumnNotFound, "column '", name,
                       "' is not in the declared schema (schema=)",
                       InAnyFile(parts[0]) ? ", though the files have it: add it there" : "",
                       "; the declared columns and partition keys:", available);
    }
    return MakeError(ErrorKind::kColumnNotFound, "column '", name, "' does not exist in '",
                     files_[0].display, "'", files_.size() > 1 ? " or any other file" : "",
                     "; available columns:", available);
  }

  // A struct becomes its leaves (the union of its fields over the files, in order of
  // first appearance); anything else is one leaf.
  arrow::Status Expand(const Leaf& leaf, std::vector<Leaf>* out) const {
    std::vector<std::string> children;
    std::set<std::string> child_names;  // (a scan of children per child: O(fields^2))
    int struct_file = -2, other_file = -2;
    std::shared_ptr<arrow::DataType> struct_type, other_type;
    const int first = options_.schema != nullptr ? -1 : 0;
    const int last = options_.schema != nullptr ? 0 : static_cast<int>(files_.size());
    for (int f = first; f < last; ++f) {
      bool nullable = false;
      ARROW_RETURN_NOT_OK(CheckOneFieldOnPath(f, leaf));
      auto type = TypeIn(f, leaf, &nullable);
      if (type == nullptr || type->id() == arrow::Type::NA) continue;
      if (type->id() == arrow::Type::STRUCT) {
        if (struct_file == -2) struct_file = f, struct_type = type;
        for (const auto& child : type->fields()) {
          if (child_names.insert(child->name()).second) children.push_back(child->name());
        }
      } else if (other_file == -2) {
        other_file = f, other_type = type;
      }
    }
    if (struct_file != -2 && other_file != -2) {
      return MakeError(ErrorKind::kSchemaMismatch, "column '", leaf.name(), "' is a struct (",
                       struct_type->ToString(), ") in '", FileName(struct_file), "' but ",
                       other_type->ToString(), " in '", FileName(other_file), "'");
    }
    if (struct_file == -2) {
      out->push_back(leaf);
      return arrow::Status::OK();
    }
    for (const auto& child : children) {
      Leaf sub = leaf;
      sub.path.push_back(child);
      ARROW_RETURN_NOT_OK(Expand(sub, out));
    }
    return arrow::Status::OK();
  }

  std::string FileName(int f) const { return f < 0 ? "the declared schema" : files_[f].display; }

  // The declared type of key `name` (a dictionary's values), or null.
  std::shared_ptr<arrow::DataType> DeclaredKeyType(const std::string& name) const {
    auto declared = options_.schema ? options_.schema->GetFieldByName(name) : nullptr;
    if (declared == nullptr) return nullptr;
    auto type = declared->type();
    if (type->id() == arrow::Type::DICTIONARY) {
      type = static_cast<const arrow::DictionaryType&>(*type).value_type();
    }
    return type;
  }

  // A key that loads from the files (some store it as a column) must be in every file
  // whose path gives it a value: that file's rows would read as null (a filter on the key
  // would drop them), where pyarrow takes the path's value.
  arrow::Status CheckKeyInEveryFile(size_t k) const {
    const PartitionKey& key = keys_[k];
    int has = -1, lacks = -1;
    for (size_t f = 0; f < files_.size(); ++f) {
      // A struct, list or map of the key's name holds no value a path could give (its
      // values vanished, the struct's leaves loaded instead; pyarrow cannot merge them).
      auto field = files_[f].schema->GetFieldByName(key.name);
      if (field != nullptr && arrow::is_nested(TypeWithoutExtension(field->type())->id())) {
        return MakeError(ErrorKind::kSchemaMismatch, "partition key '", key.name, "' of the paths is a ",
                         field->type()->ToString(), " column in '", files_[f].display,
                         "': a path's value cannot be one; rename the directories' key or the column");
      }
      const bool in = !files_[f].schema->GetAllFieldIndices(key.name).empty();
      if (in && has < 0) has = static_cast<int>(f);
      if (!in && !key.null[f] && lacks < 0) lacks = static_cast<int>(f);
    }
    if (has < 0 || lacks < 0) return arrow::Status::OK();
    return MakeError(ErrorKind::kSchemaMismatch, "partition key '", key.name,
                     "' is stored as a column in '", files_[has].display, "' but not in '",
                     files_[lacks].display, "', whose path gives it '", key.values[lacks],
                     "' (its rows would load as null there); write the column in every file "
                     "or in none");
  }

  // Where file f stores a column of times as INT96 (`leaves`, loaded as `own`), whose unit
  // is an option, and `other` holds timestamps of another unit: how to read them in that
  // unit (and that ms or s drops digits). None where the units agree (the zones differ,
  // which the option cannot change); where `other` has a zone, that no unit helps.
  std::string Int96Remedy(int f, const std::vector<int>& leaves, const arrow::DataType& own,
                          const arrow::DataType& other) const {
    auto element = [](const arrow::DataType& type) {
      const arrow::DataType* t = &type;
      while (arrow::is_list_like(t->id()) && t->num_fields() == 1) t = t->field(0)->type().get();
      return t;
    };
    const arrow::DataType* t = element(other);
    if (t->id() != arrow::Type::TIMESTAMP) return "";
    const arrow::DataType* o = element(own);
    if (o->id() == arrow::Type::TIMESTAMP &&
        static_cast<const arrow::TimestampType&>(*o).unit() ==
            static_cast<const arrow::TimestampType&>(*t).unit()) {
      return "";
    }
    const bool zoned = !static_cast<const arrow::TimestampType&>(*t).timezone().empty();
    for (int l : leaves) {
      if (files_[f].manifest->descr->Column(l)->physical_type() != parquet::Type::INT96) continue;
      if (zoned) {  // INT96 loads without a zone in any unit: no unit makes them agree
        return std::string(" ('") + files_[f].display + "' stores them as INT96, which has no "
               "time zone in any coerce_int96_timestamp_unit: such files do not load beside "
               "timestamps with a time zone; rewrite one of them, or select other columns)";
      }
      const auto unit = static_cast<const arrow::TimestampType&>(*t).unit();
      return std::string(" ('") + files_[f].display + "' stores them as INT96, which "
             "coerce_int96_timestamp_unit='" +
             (unit == arrow::TimeUnit::SECOND   ? "s"
              : unit == arrow::TimeUnit::MILLI  ? "ms"
              : unit == arrow::TimeUnit::MICRO  ? "us"
                                                : "ns") +
             "' reads in that unit" +
             (unit == arrow::TimeUnit::MILLI || unit == arrow::TimeUnit::SECOND
                  ? std::string(", dropping the digits below a ") +
                        (unit == arrow::TimeUnit::MILLI ? "millisecond" : "second") +
                        " as pyarrow does"
                  : std::string()) +
             ")";
    }
    return "";
  }

  // Whether file f lacks `leaf` below a list (or map) of structs that it has: its rows
  // there are lists with lengths, which a column of nulls would lose. `list` gets the
  // list's name.
  bool LacksBelowList(int f, const Leaf& leaf, std::string* list) const {
    auto field = files_[f].schema->GetFieldByName(leaf.top);
    if (field == nullptr) return false;
    auto type = field->type();
    bool any_list = false;
    std::vector<std::string> walked;
    for (const std::string& name : leaf.path) {
      bool through_list = false;
      const arrow::StructType* st = StructBelow(*type, &through_list);
      any_list = any_list || through_list;
      if (st == nullptr) return false;  // not a struct there: refused as a type difference
      const int i = st->GetFieldIndex(name);
      if (i < 0) {
        *list = Join(leaf.top, walked);
        return any_list;
      }
      walked.push_back(name);
      type = through_list ? arrow::list(st->field(i)->type()) : st->field(i)->type();
    }
    return false;
  }

  // A key from the paths declared an integer type loads as int64: a value of the declared
  // type that int64 does not hold (a uint64 above 2^63 - 1) made the key a str column
  // instead, silently (the filter compared it as text).
  arrow::Status CheckDeclaredIntegerKey(size_t k) const {
    const PartitionKey& key = keys_[k];
    auto type = DeclaredKeyType(key.name);
    if (type == nullptr || !arrow::is_integer(type->id())) return arrow::Status::OK();
    for (size_t f = 0; f < key.values.size(); ++f) {
      if (key.null[f] || ParsesAsInt64(key.values[f]) ||
          !arrow::Scalar::Parse(type, key.values[f]).ok()) {
        continue;  // (a value that is no such integer: refused by AddPartition, naming it)
      }
      return MakeError(ErrorKind::kSchemaMismatch, "partition key '", key.name, "' is declared ",
                       type->ToString(), " in schema=, but the path of '", files_[f].display,
                       "' gives it '", key.values[f], "', which int64 does not hold (a key "
                       "from the paths declared an integer type loads as int64); declare "
                       "pa.string() to load it as text");
    }
    return arrow::Status::OK();
  }

  // How key k loads, selected or not (the filter types it so too): from the files when
  // a file stores it as a column and the declared schema, if any, names it (Polars'
  // partition_by); else from the paths, as text when declared a string or when a value
  // is not an integer, else as int64.
  KeyLoad LoadOfKey(size_t k) const {
    const std::string& name = keys_[k].name;
    if (InAnyFile(name) && IsTopField(name)) return KeyLoad::kFiles;
    auto type = DeclaredKeyType(name);
    if (type != nullptr &&
        (arrow::is_string(type->id()) || type->id() == arrow::Type::STRING_VIEW)) {
      return KeyLoad::kText;
    }
    for (size_t f = 0; f < keys_[k].values.size(); ++f) {
      if (!keys_[k].null[f] && !ParsesAsInt64(keys_[k].values[f])) return KeyLoad::kText;
    }
    return KeyLoad::kInt64;
  }

  // A key from the paths: int64 where every value is an integer, else str; a declared
  // type decides between them (text keeps "01" as it is, as pyarrow's; an integer type
  // loads as int64 and needs every value to be one of that type).
  arrow::Status AddPartition(const std::string& name, int key) {
    const auto& k = keys_[key];
    bool any_null = false;
    for (size_t f = 0; f < k.values.size(); ++f) any_null = any_null || k.null[f];
    const bool all_int = out_.key_loads[key] == KeyLoad::kInt64;
    if (auto type = DeclaredKeyType(name)) {
      const bool text = arrow::is_string(type->id()) || type->id() == arrow::Type::STRING_VIEW;
      if (!text && !arrow::is_integer(type->id())) {
        return MakeError(ErrorKind::kSchemaMismatch, "partition key '", name, "' is declared ",
                         type->ToString(), " in schema=; a partition key loads as int64 "
                         "(declare an integer type) or str (declare pa.string())");
      }
      for (size_t f = 0; f < k.values.size() && !text; ++f) {
        if (!k.null[f] && !arrow::Scalar::Parse(type, k.values[f]).ok()) {
          return MakeError(ErrorKind::kSchemaMismatch, "partition key '", name, "' is declared ",
                           type->ToString(), " in schema=, but the path of '", files_[f].display,
                           "' gives it '", k.values[f], "', not such an integer",
                           all_int ? "" : "; declare pa.string()");
        }
      }
    }
    ColumnSpec spec;
    spec.name = name;
    spec.is_partition = true;
    spec.kind = all_int                             ? ColumnKind::kTensor
                : options_.spec.strings_as_bytes ? ColumnKind::kBytes  // as the files' text
                                                 : ColumnKind::kString;
    spec.text = !all_int;
    spec.dtype = DType::kInt64;
    spec.arrow_type = all_int ? "int64" : "string";
    Push(spec, key, nullptr, std::vector<ColumnSource>(files_.size()), any_null, "");
    return arrow::Status::OK();
  }

  arrow::Status AddLeaf(const Leaf& leaf) {
    ARROW_RETURN_NOT_OK(CheckOneFieldNamed(leaf.top));
    std::vector<ColumnSource> sources(files_.size());
    std::shared_ptr<arrow::DataType> unified;
    int unified_from = -1;  // the file whose type `unified` last took
    bool nullable = false;
    const bool declared = options_.schema != nullptr;
    if (declared) {
      bool n = false;
      unified = TypeIn(-1, leaf, &n);
      nullable = n;
    }
    for (size_t f = 0; f < files_.size(); ++f) {
      bool n = false;
      ARROW_RETURN_NOT_OK(CheckOneFieldOnPath(static_cast<int>(f), leaf));
      auto type = TypeIn(static_cast<int>(f), leaf, &n);
      ColumnSource& src = sources[f];
      if (type == nullptr) {
        std::string where;
        std::shared_ptr<arrow::DataType> what;
        if (NonStructOnPath(static_cast<int>(f), leaf, &where, &what)) {
          return MakeError(ErrorKind::kSchemaMismatch, "column '", Quoted(leaf.name()),
                           "' is a field of struct '", Quoted(where), "'",
                           declared ? " in the declared schema" : "", ", but '", Quoted(where),
                           "' is ", what->ToString(), " in '", files_[f].display,
                           "' (not a struct): its values there would load as nulls; "
                           "declare its type, or select other columns");
        }
        std::string list;
        if (LacksBelowList(static_cast<int>(f), leaf, &list)) {
          return MakeError(ErrorKind::kSchemaMismatch, "column '", leaf.name(),
                           "' is absent from '", files_[f].display, "', whose '", list,
                           "' is a list (or map) of structs without it: its rows there would be lists "
                           "of nulls as long as the list's (pqloader cannot read them so yet); "
                           "select other columns, or write the field in every file");
        }
        nullable = true;  // absent: null in this file's rows
        continue;
      }
      nullable = nullable || n;
      src.field = files_[f].schema->GetFieldIndex(leaf.top);
      src.path = leaf.path;
      src.type = type;
      if (!LeavesAt(files_[f].manifest->schema_fields[src.field], leaf.path, 0, &src.leaves)) {
        return MakeError(ErrorKind::kInvalidData, "'", files_[f].display, "': column '",
                         leaf.name(), "' has no Parquet leaves");
      }
      if (declared) {
        if (!ConvertsTo(*type, *unified, /*declared=*/true)) {
          const std::string why = UnitsDiffer(*type, *unified);
          // A list declared a fixed-size list: no loss of values, but no length either
          // (its rows may differ), and rows of one length load as (batch, n) as they are.
          const bool list_to_fixed =
              (type->id() == arrow::Type::LIST || type->id() == arrow::Type::LARGE_LIST) &&
              unified->id() == arrow::Type::FIXED_SIZE_LIST;
          return MakeError(ErrorKind::kSchemaMismatch, "column '", leaf.name(), "' is ",
                           type->ToString(), " in '", files_[f].display,
                           "', which does not convert to the declared ", unified->ToString(),
                           list_to_fixed
                               ? ": a list has no fixed length to convert by (its rows may "
                                 "differ); declare it a list: rows of one length load as "
                                 "(batch, n) as they are"
                           : why.empty() ? " without loss"
                                         : ": " + why + Int96Remedy(static_cast<int>(f),
                                                                    src.leaves, *type, *unified));
        }
        continue;
      }
      if (unified == nullptr) {
        unified = type;
        unified_from = static_cast<int>(f);
        continue;
      }
      auto common = CommonType(unified, type);
      if (common == nullptr) {
        const std::string why = UnitsDiffer(*unified, *type);
        return MakeError(ErrorKind::kSchemaMismatch, "column '", leaf.name(), "' has type ",
                         unified->ToString(), " in '", files_[unified_from].display,
                         "' but type ", type->ToString(), " in '", files_[f].display, "', and ",
                         why.empty() ? "neither converts to the other without loss; declare the "
                                       "type to load it as with schema=, or select other columns"
                                     : why +
                                           Int96Remedy(unified_from, sources[unified_from].leaves,
                                                       *unified, *type) +
                                           Int96Remedy(static_cast<int>(f), src.leaves, *type,
                                                       *unified));
      }
      if (!common->Equals(*unified)) unified_from = static_cast<int>(f);
      unified = common;
    }
    // Decimals as unscaled integers, also in lists: each file's are converted at its own
    // scale, so every file must have the one the column has.
    const int32_t scale = unified != nullptr ? DecimalScale(*unified) : -1;
    if (options_.spec.decimals_as_int64 && scale >= 0) {
      // Undeclared, each file against the first holding a decimal (the unified type,
      // decimal256(46, 9) for scales 1 and 9, is no file's: "elsewhere" named neither).
      int first = -1;
      for (size_t f = 0; f < files_.size(); ++f) {
        const auto& t = sources[f].type;
        if (t == nullptr || DecimalScale(*t) < 0) continue;
        const bool differs =
            declared ? DecimalScale(*t) != scale
                     : first >= 0 && DecimalScale(*t) != DecimalScale(*sources[first].type);
        if (differs) {
          const std::string other =
              declared ? unified->ToString() + " in the declared schema"
                       : sources[first].type->ToString() + " in '" + files_[first].display + "'";
          return MakeError(ErrorKind::kSchemaMismatch, "column '", leaf.name(), "' is ",
                           t->ToString(), " in '", files_[f].display, "' but ", other,
                           ": decimals='int64' needs one scale (unscaled integers of two "
                           "scales are different numbers)");
        }
        if (first < 0) first = static_cast<int>(f);
      }
    }
    if (unified == nullptr) {  // (no file has it: Locate and Expand find only leaves some file has)
      return MakeError(ErrorKind::kColumnNotFound, "column '", Quoted(leaf.name()),
                       "' is in no file");
    }
    auto spec_or = SpecForField(*arrow::field(leaf.name(), unified), options_.spec);
    if (!spec_or.ok() && !declared && unified_from >= 0) {
      // Name the file to look at (WithMessage keeps the error's kind).
      const auto& own = sources[unified_from].type;
      const bool as_stored = own != nullptr && own->Equals(*unified);
      return spec_or.status().WithMessage(
          spec_or.status().message(), as_stored ? " (the type of '" : " (unified from the files' types; the last to widen it: '",
          files_[unified_from].display, "')");
    }
    ARROW_ASSIGN_OR_RAISE(auto spec, std::move(spec_or));
    // (a dotted name's: a struct's leaf, or a top-level column whose name holds a '.')
    Push(spec, -1, unified, std::move(sources), nullable,
         leaf.name().find('.') == std::string::npos ? std::string()
                                                    : EncodeLeafPath(leaf.top, leaf.path));
    return arrow::Status::OK();
  }

  void Push(const ColumnSpec& spec, int key, std::shared_ptr<arrow::DataType> type,
            std::vector<ColumnSource> sources, bool nullable, std::string leaf_path) {
    out_.specs.push_back(spec);
    out_.leaf_paths.push_back(std::move(leaf_path));
    out_.partition_index.push_back(key);
    out_.types.push_back(std::move(type));
    out_.nullable.push_back(nullable);
    out_.sources.resize(files_.size());
    for (size_t f = 0; f < files_.size(); ++f) out_.sources[f].push_back(std::move(sources[f]));
    nullable_.push_back(nullable);
  }

  // Insert "<name>_valid" after each column that asks for one.
  arrow::Status AddMasks() {
    const std::set<std::string>& wanted = null_mask_names_;
    std::set<std::string> matched;
    ResolvedColumns with;
    with.sources.resize(files_.size());
    std::set<std::string> names;
    for (const auto& s : out_.specs) names.insert(s.name);
    for (size_t c = 0; c < out_.specs.size(); ++c) {
      const std::string& name = out_.specs[c].name;
      // A struct's name asks for every leaf below it.
      const std::vector<std::string> asking = NamesAsking(wanted, name);
      const bool asked = !asking.empty();
      matched.insert(asking.begin(), asking.end());
      auto copy = [&](size_t from) {
        with.specs.push_back(out_.specs[from]);
        with.partition_index.push_back(out_.partition_index[from]);
        with.types.push_back(out_.types[from]);
        with.nullable.push_back(out_.nullable[from]);
        with.leaf_paths.push_back(out_.leaf_paths[from]);
        for (size_t f = 0; f < files_.size(); ++f) with.sources[f].push_back(out_.sources[f][from]);
      };
      copy(c);
      if (!(asked || (options_.null_mask_all && nullable_[c]))) continue;
      ColumnSpec mask;
      mask.name = name + "_valid";
      if (names.count(mask.name) > 0) {
        return arrow::Status::Invalid("null_mask would add column '", mask.name,
                                      "', but the dataset has a column of that name");
      }
      mask.kind = ColumnKind::kTensor;
      mask.dtype = DType::kBool;
      mask.arrow_type = "bool";
      mask.mask_of = static_cast<int>(with.specs.size()) - 1;
      with.specs.push_back(mask);
      with.partition_index.push_back(-1);
      with.types.push_back(nullptr);
      with.nullable.push_back(false);
      with.leaf_paths.emplace_back();
      for (size_t f = 0; f < files_.size(); ++f) with.sources[f].push_back(ColumnSource{});
    }
    for (const auto& w : wanted) {
      if (matched.count(w) == 0) {
        return MakeError(ErrorKind::kColumnNotFound, "null_mask names column '", w,
                         "', which is not among the selected columns");
      }
    }
    with.key_loads = std::move(out_.key_loads);
    with.key_errors = std::move(out_.key_errors);
    out_ = std::move(with);
    return arrow::Status::OK();
  }

  const std::vector<FileColumns>& files_;
  const std::vector<PartitionKey>& keys_;
  const ColumnsOptions& options_;
  const std::set<std::string> null_mask_names_;  // options_.null_mask_columns
  ResolvedColumns out_;
  std::vector<bool> nullable_;
};

// Skip a JSON value starting at s[i] (a string, object, array or scalar).
size_t SkipJsonValue(const std::string& s, size_t i) {
  if (i >= s.size()) return i;
  if (s[i] == '"') {
    for (++i; i < s.size() && s[i] != '"'; ++i) {
      if (s[i] == '\\') ++i;
    }
    return i + 1;
  }
  if (s[i] == '{' || s[i] == '[') {
    int depth = 0;
    for (; i < s.size(); ++i) {
      if (s[i] == '"') {
        i = SkipJsonValue(s, i) - 1;
      } else if (s[i] == '{' || s[i] == '[') {
        ++depth;
      } else if (s[i] == '}' || s[i] == ']') {
        if (--depth == 0) return i + 1;
      }
    }
    return i;
  }
  while (i < s.size() && s[i] != ',' && s[i] != ']' && s[i] != '}') ++i;
  return i;
}

}  // namespace

// "<length>:<name>" for the top-level field, then for each name of the path: no name,
// whatever it holds ('.', ':'), is taken for another.
std::string EncodeLeafPath(const std::string& top, const std::vector<std::string>& path) {
  std::string out = std::to_string(top.size()) + ":" + top;
  for (const auto& p : path) out += std::to_string(p.size()) + ":" + p;
  return out;
}

bool DecodeLeafPath(const std::shared_ptr<const arrow::KeyValueMetadata>& metadata,
                    std::string* top, std::vector<std::string>* path) {
  const int k = metadata->FindKey(kLeafPathKey);
  if (k < 0) return false;
  const std::string& s = metadata->value(k);
  std::vector<std::string> parts;
  size_t at = 0;
  while (at < s.size()) {
    const size_t colon = s.find(':', at);
    if (colon == std::string::npos || colon == at) return false;
    size_t n = 0;
    const auto [end, ec] = std::from_chars(s.data() + at, s.data() + colon, n);
    if (ec != std::errc() || end != s.data() + colon || n > s.size() - colon - 1) return false;
    parts.push_back(s.substr(colon + 1, n));
    at = colon + 1 + n;
  }
  if (parts.empty()) return false;
  *top = parts[0];
  path->assign(parts.begin() + 1, parts.end());
  return true;
}

void PandasIndexes::Add(const arrow::Schema& schema, const arrow::KeyValueMetadata* metadata) {
  const auto own = PandasIndexColumns(metadata);
  for (const auto& field : schema.fields()) {
    if (std::find(own.begin(), own.end(), field->name()) == own.end()) {
      data_.insert(field->name());
    }
  }
  index_.insert(own.begin(), own.end());
}

std::vector<std::string> PandasIndexColumns(const arrow::KeyValueMetadata* metadata) {
  std::vector<std::string> out;
  if (metadata == nullptr) return out;
  const int i = metadata->FindKey("pandas");
  if (i < 0) return out;
  const std::string& json = metadata->value(i);
  size_t at = json.find("\"index_columns\"");
  if (at == std::string::npos) return out;
  at = json.find('[', at);
  if (at == std::string::npos) return out;
  ++at;
  while (at < json.size()) {
    while (at < json.size() && (json[at] == ' ' || json[at] == ',' || json[at] == '\n')) ++at;
    if (at >= json.size() || json[at] == ']' || json[at] == '}') break;
    const size_t end = SkipJsonValue(json, at);
    // Malformed JSON (the metadata is the file's, untrusted): stop where no value starts.
    if (end <= at) break;
    if (json[at] == '"' && end > at + 1) {
      std::string name;
      for (size_t k = at + 1; k + 1 < end; ++k) {
        if (json[k] == '\\' && k + 2 < end) ++k;  // names with escapes: the escaped char
        name += json[k];
      }
      out.push_back(name);
    }
    at = end;
  }
  return out;
}

arrow::Result<ResolvedColumns> ResolveColumns(const std::vector<FileColumns>& files,
                                              const std::vector<PartitionKey>& keys,
                                              const ColumnsOptions& options) {
  if (options.schema != nullptr) {
    // Declared as the files are read: extension types as their storage (a plain
    // fixed_shape_tensor as nested fixed-size lists, bool8 as bool), as pq.read_schema(f)
    // declares them (the files' own types were refused as not converting to themselves).
    ColumnsOptions plain = options;
    plain.schema = SchemaWithoutExtensions(options.schema);
    return Resolver(files, keys, plain).Run();
  }
  return Resolver(files, keys, options).Run();
}

void LeavesOf(const parquet::arrow::SchemaField& f, std::vector<int>* out) {
  if (f.column_index >= 0) out->push_back(f.column_index);
  for (const auto& child : f.children) LeavesOf(child, out);
}

std::vector<int> LeavesToRead(const parquet::arrow::SchemaField& field, std::vector<int> leaves) {
  if (leaves.empty() || field.field->type()->id() == arrow::Type::EXTENSION) {
    leaves.clear();
    LeavesOf(field, &leaves);
  }
  return leaves;
}

}  // namespace pqloader
