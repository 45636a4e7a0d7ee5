/* envexec ENV_FILE ARGV_FILE DEFAULT [ARGS...]: runs a program with exactly the
   environment in ENV_FILE, a sequence of NUL-terminated KEY=VALUE records (the
   /proc/PID/environ format). The program and its arguments are ARGV_FILE's
   NUL-terminated items, or, when ARGV_FILE is empty, DEFAULT and ARGS. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    char *buf = NULL; size_t cap = 0; int c;
    *len = 0;
    while ((c = fgetc(f)) != EOF) {
        if (*len + 1 >= cap) { cap = cap ? cap * 2 : 4096; buf = realloc(buf, cap); if (!buf) exit(1); }
        buf[(*len)++] = (char)c;
    }
    fclose(f);
    if (*len > 0 && buf[*len - 1] != '\0') { fprintf(stderr, "envexec: %s is not NUL-terminated items\n", path); exit(1); }
    return buf;
}

static char **split(char *buf, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) if (buf[i] == '\0') n++;
    char **items = calloc(n + 1, sizeof(char *));
    if (!items) exit(1);
    size_t k = 0;
    for (char *p = buf; p < buf + len; p += strlen(p) + 1) items[k++] = p;
    items[k] = NULL;
    return items;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: envexec ENV_FILE ARGV_FILE DEFAULT [ARGS...]\n"); return 2; }
    size_t env_len, argv_len;
    char *env = slurp(argv[1], &env_len);
    char *args = slurp(argv[2], &argv_len);
    char **envp = split(env, env_len);
    for (char **e = envp; *e; e++) if (!strchr(*e, '=')) { fprintf(stderr, "envexec: a record without '='\n"); return 1; }
    char **run = argv_len > 0 ? split(args, argv_len) : argv + 3;
    execve(run[0], run, envp);
    perror(run[0]);
    return 127;
}
