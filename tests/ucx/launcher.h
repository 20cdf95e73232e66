// Starts the ranks of a multi-process ring as child processes (ucx_rank), each with its output
// in a file, and collects their RESULT lines. Every wait is bounded: on overrun the children are
// killed and the test fails instead of hanging.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace stria_test {

// A port free on loopback right now, for a rank 0 to listen on a moment later. Drawn below the
// kernel's ephemeral range (32768 and up by default): a port the kernel handed out and took back
// may go next to any socket bound to port 0 in a parallel test (a stria_get_unique_id listener,
// UCX's own sockets), and a rank would then knock on a stranger's door. Here only another
// FreePort can clash, one chance in thousands.
inline int FreePort() {
  static std::mt19937 rng(static_cast<unsigned>(getpid()) * 2654435761u ^
                          static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = 20000 + static_cast<int>(rng() % 12000);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    close(fd);
    if (free) return port;
  }
  return 0;  // none found: the caller's rendezvous then fails with a message
}

// A fresh directory for one test's rank outputs and id files: $TMPDIR/<prefix>-XXXXXX.
inline std::string TempDir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  return mkdtemp(tmpl.data());
}

struct RankResult {
  bool exited = false;  // false: killed by a signal or still running at the deadline
  int exit_code = -1;
  int signal = 0;
  int code = -1;  // the stria_status_t of the RESULT line; -1: no RESULT line
  double seconds = -1;
  std::string message, output;
};

// Every rank's exit, RESULT code, time and output, for a failing test's message.
inline std::string Describe(const std::map<int, RankResult>& results) {
  std::ostringstream os;
  for (auto& [rank, r] : results)
    os << "--- rank " << rank << " (exit " << r.exit_code << ", signal " << r.signal << ", code " << r.code << ", "
       << r.seconds << " s)\n"
       << r.output;
  return os.str();
}

class Launch {
 public:
  explicit Launch(std::string dir) : dir_(std::move(dir)) {}
  ~Launch() {
    for (auto& [rank, pid] : pids_) {
      kill(pid, SIGKILL);
      kill(pid, SIGCONT);
      waitpid(pid, nullptr, 0);
    }
  }

  // Starts `binary args...` as `rank` with extra environment entries ("K=V").
  void Start(int rank, const std::string& binary, const std::vector<std::string>& args,
             const std::vector<std::string>& env) {
    std::vector<std::string> argv_s{binary};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
    env_s.insert(env_s.end(), env.begin(), env.end());
    std::vector<char*> argv, envp;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    const std::string out = OutPath(rank);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    if (posix_spawn(&pid, binary.c_str(), &fa, nullptr, argv.data(), envp.data()) == 0) pids_[rank] = pid;
    posix_spawn_file_actions_destroy(&fa);
  }

  pid_t pid(int rank) const { return pids_.count(rank) ? pids_.at(rank) : -1; }

  // Waits for every started rank, at most `seconds`; what is still running then is killed.
  std::map<int, RankResult> Wait(double seconds, const std::vector<int>& ignore = {}) {
    std::map<int, RankResult> results;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    std::map<int, pid_t> running = pids_;
    for (int r : ignore) running.erase(r);
    while (!running.empty() && std::chrono::steady_clock::now() < deadline) {
      for (auto it = running.begin(); it != running.end();) {
        int st = 0;
        if (waitpid(it->second, &st, WNOHANG) == it->second) {
          RankResult& res = results[it->first];
          res.exited = WIFEXITED(st);
          res.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
          res.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
          pids_.erase(it->first);
          it = running.erase(it);
        } else {
          ++it;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (auto& [rank, pid] : running) {
      kill(pid, SIGKILL);
      kill(pid, SIGCONT);
      waitpid(pid, nullptr, 0);
      pids_.erase(rank);
      results[rank].code = -1;  // hung: no result
    }
    for (auto& [rank, res] : results) Parse(rank, &res);
    return results;
  }

  std::string OutPath(int rank) const { return dir_ + "/rank" + std::to_string(rank) + ".txt"; }

 private:
  void Parse(int rank, RankResult* res) const {
    std::ifstream in(OutPath(rank));
    std::stringstream ss;
    ss << in.rdbuf();
    res->output = ss.str();
    std::istringstream lines(res->output);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("RESULT ", 0) != 0) continue;
      auto field = [&](const std::string& key) {
        const size_t at = line.find(key + "=");
        if (at == std::string::npos) return std::string();
        const size_t start = at + key.size() + 1;
        const size_t end = key == "message" ? line.size() : line.find(' ', start);
        return line.substr(start, end == std::string::npos ? std::string::npos : end - start);
      };
      res->code = std::atoi(field("code").c_str());
      res->seconds = std::atof(field("seconds").c_str());
      res->message = field("message");
    }
  }

  std::string dir_;
  std::map<int, pid_t> pids_;
};

}  // namespace stria_test
