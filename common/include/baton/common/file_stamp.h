// What identifies a file's contents cheaply, for the files a process follows without a restart
// (API keys, the HTTPS front's certificate): its inode, size and modification time. A
// Kubernetes Secret volume swaps its files by renaming a directory (a new inode), cert-manager's
// CSI driver rewrites them, an operator copies new ones over; each changes the stamp. "-" for a
// file that cannot be read.
#pragma once

#include <sys/stat.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace baton {

inline std::string FileStamp(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return "-";
  return absl::StrCat(st.st_ino, ",", st.st_size, ",", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

}  // namespace baton
