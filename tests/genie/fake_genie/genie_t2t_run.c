/* A TEST-ONLY genie-t2t-run over the test libGenie (fake_libgenie.c), through the same documented
 * C API: same flags, stdout shape and --profile file as Qualcomm's tool (facts/genie.md), one query
 * per process (so every run pays the init). Used to test the one-run-per-turn fallback. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int32_t Genie_Status_t;
typedef const void *H;
typedef void (*QueryCb)(const char *, const int, const void *);
typedef void (*AllocCb)(size_t, const char **);
Genie_Status_t GenieDialogConfig_createFromJson(const char *, H *);
Genie_Status_t GenieDialog_create(H, H *);
Genie_Status_t GenieDialog_query(H, const char *, int, QueryCb, const void *);
Genie_Status_t GenieDialog_free(H);
Genie_Status_t GenieProfile_create(H, H *);
Genie_Status_t GenieDialogConfig_bindProfiler(H, H);
Genie_Status_t GenieProfile_getJsonData(H, AllocCb, const char **);
uint32_t Genie_getApiMajorVersion(void);
uint32_t Genie_getApiMinorVersion(void);
uint32_t Genie_getApiPatchVersion(void);

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  size_t got = fread(b, 1, (size_t)n, f);
  b[got] = 0;
  fclose(f);
  return b;
}
static void on_text(const char *r, const int code, const void *u) {
  (void)code; (void)u;
  fputs(r, stdout);
  fflush(stdout);
}
static void alloc(size_t n, const char **out) { *out = malloc(n); }

int main(int argc, char **argv) {
  const char *config = NULL, *prompt = NULL, *prompt_file = NULL, *profile = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if ((!strcmp(a, "-c") || !strcmp(a, "--config")) && v) config = argv[++i];
    else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && v) prompt = argv[++i];
    else if (!strcmp(a, "--prompt_file") && v) prompt_file = argv[++i];
    else if (!strcmp(a, "--profile") && v) profile = argv[++i];
    else if (!strcmp(a, "--log") && v) i++;
  }
  if (!prompt && !prompt_file) { fprintf(stderr, "ERROR:: Please provide prompt using --prompt or --prompt_file.\n"); return 1; }
  if (profile && access(profile, F_OK) == 0) {
    fprintf(stderr, "ERROR: Invalid --profile argument. Output file %s already exists.\n", profile);
    return 1;
  }
  char *cfg = config ? slurp(config) : NULL;
  char *text = prompt_file ? slurp(prompt_file) : (char *)prompt;
  if (!cfg || !text) { fprintf(stderr, "ERROR: cannot read the config or the prompt file\n"); return 1; }
  printf("Using libGenie.so version %u.%u.%u\n\n", Genie_getApiMajorVersion(), Genie_getApiMinorVersion(),
         Genie_getApiPatchVersion());
  H c = NULL, d = NULL, p = NULL;
  if (GenieDialogConfig_createFromJson(cfg, &c) != 0) { puts("Failed to create the dialog config."); return 1; }
  if (profile) { GenieProfile_create(NULL, &p); GenieDialogConfig_bindProfiler(c, p); }
  if (GenieDialog_create(c, &d) != 0) {
    puts("[ERROR] \"Create From Binary FAILED!\"\nFailure to initialize model\nFailed to create the dialog.");
    return 1;
  }
  printf("[PROMPT]: %s\n\n[BEGIN]: ", text);
  fflush(stdout);
  Genie_Status_t st = GenieDialog_query(d, text, 0, on_text, NULL);
  puts("[END]");
  fflush(stdout);
  if (profile) {
    const char *json = NULL;
    GenieProfile_getJsonData(p, alloc, &json);
    FILE *f = fopen(profile, "w");
    if (f && json) { fputs(json, f); fclose(f); }
  }
  GenieDialog_free(d);
  return st < 0 ? 1 : 0;
}
