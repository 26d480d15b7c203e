/* A hardware tool (ethtool, rdma, mlxlink, nvidia-smi, ...) on an emulated-sshd host: relays its command line to
 * the bench over the UNIX socket `tools.sock` beside its bin/ directory and prints what the emulator answers
 * (devices/emulated/sshd_hosts.py). The tool's name is the basename of argv[0].
 *
 * Request: the number of arguments, then the arguments, each ended by a NUL. Reply: frames of a type byte ('o' stdout,
 * 'e' stderr, 'x' exit status), a 4-byte big-endian length and that many bytes; 'x' carries the status as
 * 4 bytes and ends the reply. Written in C so that a tool the agent polls every few hundred microseconds
 * costs what a real one does (a Python interpreter costs tens of milliseconds to start). */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void put_all(int fd, const char *data, size_t size) {
    while (size > 0) {
        ssize_t n = write(fd, data, size);
        if (n < 0) {
            if (errno == EINTR) continue;
            exit(141); /* the reader went away */
        }
        data += n;
        size -= (size_t)n;
    }
}

static int get_all(int fd, char *data, size_t size) {
    while (size > 0) {
        ssize_t n = read(fd, data, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        data += n;
        size -= (size_t)n;
    }
    return 0;
}

int main(int argc, char **argv) {
    char exe[PATH_MAX], path[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len < 0) {
        perror("toolshim: /proc/self/exe");
        return 127;
    }
    exe[len] = 0;
    snprintf(path, sizeof path, "%s/../tools.sock", dirname(exe));
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) {
        fprintf(stderr, "toolshim: socket path too long: %s\n", path);
        return 127;
    }
    strcpy(addr.sun_path, path);
    int sock = socket(AF_UNIX, SOCK_STREAM, 0);
    if (sock < 0 || connect(sock, (struct sockaddr *)&addr, sizeof addr) < 0) {
        fprintf(stderr, "toolshim: %s: %s\n", path, strerror(errno));
        return 127;
    }
    char count[16];
    snprintf(count, sizeof count, "%d", argc);
    put_all(sock, count, strlen(count) + 1);
    char *name = basename(argv[0]);
    put_all(sock, name, strlen(name) + 1);
    for (int i = 1; i < argc; i++) put_all(sock, argv[i], strlen(argv[i]) + 1);
    static char buf[65536];
    for (;;) {
        unsigned char head[5];
        if (get_all(sock, (char *)head, sizeof head) < 0) {
            fprintf(stderr, "toolshim: the bench closed the connection\n");
            return 127;
        }
        uint32_t size = (uint32_t)head[1] << 24 | (uint32_t)head[2] << 16 | (uint32_t)head[3] << 8 | head[4];
        if (head[0] == 'x') {
            unsigned char status[4];
            if (size != 4 || get_all(sock, (char *)status, 4) < 0) return 127;
            return (int)((uint32_t)status[0] << 24 | (uint32_t)status[1] << 16 | (uint32_t)status[2] << 8 | status[3]);
        }
        while (size > 0) {
            size_t chunk = size < sizeof buf ? size : sizeof buf;
            if (get_all(sock, buf, chunk) < 0) return 127;
            put_all(head[0] == 'e' ? 2 : 1, buf, chunk);
            size -= (uint32_t)chunk;
        }
    }
}
