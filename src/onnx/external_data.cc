#include "onnx/external_data.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/file_io.h"

namespace onnxtrain {

std::string read_model_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) OT_THROW(kInvalidArgument, "cannot open model file '", path, "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void read_external_data(Tensor& t, const std::vector<std::pair<std::string, std::string>>& entries,
                        const std::string& base_dir, const std::string& what) {
  namespace fs = std::filesystem;
  const size_t nbytes = t.nbytes();
  std::string location;
  int64_t offset = 0, length = -1;
  auto parse_int = [&](const std::string& key, const std::string& text) {
    int64_t v = 0;
    auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), v);
    OT_CHECK(err == std::errc() && end == text.data() + text.size() && v >= 0, what, ": external data ", key, " '",
             text, "' is not a non-negative integer");
    return v;
  };
  for (const auto& [key, value] : entries) {
    if (key == "location") location = value;
    else if (key == "offset") offset = parse_int("offset", value);
    else if (key == "length") length = parse_int("length", value);
  }
  OT_CHECK(!location.empty(), what, ": external data without a location");
  OT_CHECK(location.find("..") == std::string::npos && location[0] != '/' && location.find('\0') == std::string::npos,
           what, ": external data location '", location, "' must be a relative path inside the model folder");
  const fs::path folder = base_dir.empty() ? "." : base_dir;
  fs::path file = folder / location;
  // The location may pass through symbolic links, but where it resolves must still be a regular
  // file inside the model folder: a link must not lead a model to read files outside it.
  std::error_code ec_folder, ec_file;
  const fs::path real_folder = fs::canonical(folder, ec_folder), real_file = fs::canonical(file, ec_file);
  OT_CHECK(!ec_folder && !ec_file, what, ": cannot open external data file '", file.string(), "'");
  const auto [folder_end, file_at] = std::mismatch(real_folder.begin(), real_folder.end(), real_file.begin(), real_file.end());
  OT_CHECK(folder_end == real_folder.end() && file_at != real_file.end(), what, ": external data location '", location,
           "' resolves to '", real_file.string(), "', outside the model folder '", real_folder.string(), "'");
  OT_CHECK(fs::is_regular_file(real_file, ec_file), what, ": external data location '", location,
           "' is not a regular file");
  std::ifstream f(file, std::ios::binary);
  OT_CHECK(bool(f), what, ": cannot open external data file '", file.string(), "'");
  f.seekg(0, std::ios::end);
  int64_t file_size = f.tellg();
  if (length < 0) length = int64_t(nbytes);
  OT_CHECK(length == int64_t(nbytes), what, ": external data length ", length, " does not match ",
           nbytes, " bytes of shape ", shape_str(t.shape()));
  OT_CHECK(offset <= file_size && length <= file_size - offset, what, ": external data range [", offset, ", ",
           offset, " + ", length, ") is outside '", file.string(), "' (", file_size, " bytes)");
  f.seekg(offset);
  f.read(static_cast<char*>(t.data()), std::streamsize(nbytes));
  OT_CHECK(bool(f), what, ": short read from '", file.string(), "'");
}

std::vector<int64_t> write_external_data_file(const std::vector<const Tensor*>& tensors, const std::string& data_path) {
  std::vector<int64_t> offsets;
  file_io::write_file_atomically(data_path, [&](int fd, const std::string& what) {
    const std::string zeros(4096, '\0');
    int64_t offset = 0;
    for (const Tensor* t : tensors) {
      const int64_t pad = (4096 - offset % 4096) % 4096;
      file_io::write_all(fd, zeros.data(), size_t(pad), what);
      offset += pad;
      offsets.push_back(offset);
      file_io::write_all(fd, t->data(), t->nbytes(), what);
      offset += int64_t(t->nbytes());
    }
  });
  return offsets;
}

}  // namespace onnxtrain
