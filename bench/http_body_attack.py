# The body-budget figure of bench/run_security_bench.sh: `baton up` (from BIN_DIR, with one
# API key) takes 32 keyless connections that each declare an 8 MiB body and send none (from
# 16 loopback source addresses), then 7 keyed requests; prints the keyed requests' statuses
# and the router's peak RSS (VmHWM) and CPU over the attack. Standard library only.
#
#   python3 bench/http_body_attack.py BIN_DIR WORK_DIR
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

KEY = "figure-key-alpha-0123456789"


def router_pid(parent):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
            command = open(f"/proc/{pid}/cmdline").read().split("\0")[0]
        except OSError:
            continue
        if ppid == parent and command.endswith("baton-router"):
            return pid
    raise SystemExit("no baton-router under baton up")


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read()
    fields = fields[fields.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kib(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def keyed_request(port, results):
    body = b'{"prompt": "Hello", "max_tokens": 2}'
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
              b"Authorization: Bearer " + KEY.encode() + b"\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    s.settimeout(30)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except OSError:
        pass
    results.append(data[9:12].decode() if data else "none")


def main():
    bin_dir, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    keys = os.path.join(work, "keys.yaml")
    with open(keys, "w") as f:
        f.write(f'"{KEY}": team-alpha\n')
    os.chmod(keys, 0o600)
    log_path = os.path.join(work, "up.log")
    up = subprocess.Popen([os.path.join(bin_dir, "baton"), "up", "--port", "0", "--http-port",
                           "0", "--data-dir", os.path.join(work, "data"), "--api-keys", keys],
                          stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    try:
        deadline, text = time.time() + 180, ""
        while time.time() < deadline and "baton up: metrics at" not in text:
            time.sleep(0.5)
            text = open(log_path).read()
        port = int(re.search(r"OpenAI API at https?://[0-9.]+:([0-9]+)/v1", text).group(1))
        pid = router_pid(up.pid)
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # VmHWM from here
        rss0, cpu0 = status_kib(pid, "VmRSS:"), cpu_seconds(pid)
        attackers = []
        for i in range(32):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % 16}", 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 8388608\r\n\r\n")
            attackers.append(s)
        results = []
        threads = [threading.Thread(target=keyed_request, args=(port, results)) for _ in range(7)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(10)  # the attackers hold their connections for the 10 s request deadline
        print(f"http body attack ({bin_dir}): keyed statuses {sorted(results)}; router peak RSS "
              f"+{(status_kib(pid, 'VmHWM:') - rss0) / 1024:.1f} MiB over {rss0 / 1024:.0f} MiB; "
              f"CPU {cpu_seconds(pid) - cpu0:.2f} s")
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=30)


if __name__ == "__main__":
    main()
