/* A TEST-ONLY libGenie.so: the documented GenieDialog C API (facts/genie.md) over a fake model that
 * sleeps on init and produces deterministic text at a set pace. It runs no model. Built by
 * tests/genie/conftest.py with cc. Knobs: keys of the dialog config JSON (so they reach a helper
 * started over SSH), each an integer:
 *   "fake-init-ms"   init time of GenieDialog_create (default 1500)
 *   "fake-token-ms"  time per generated token (default 20)
 *   "fake-tokens"    tokens per reply when no max is set (default 12)
 *   "fake-fail-create": 1 makes GenieDialog_create fail
 *   "fake-creates-ok": N lets the first N GenieDialog_create calls succeed and fails the rest
 *   "fake-fail-reset": 1 makes GenieDialog_reset fail (GENIE_STATUS_ERROR_GENERAL, the KV cache kept)
 * and Genie's own "max-num-tokens" (the reply budget, as genie-t2t-run takes it from the config;
 * GenieDialog_setMaxNumTokens overrides it)
 * The environment variable FAKE_GENIE_NO_PROFILE makes GenieProfile_create fail (no profile to read),
 * and "fake-echo-file": "PATH" appends every query's text (then a 0x1e separator) to PATH.
 * Prompt tokens are counted as ceil(bytes / 4). The KV cache persists across queries until reset. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int32_t Genie_Status_t;
typedef const void *GenieDialogConfig_Handle_t;
typedef const void *GenieDialog_Handle_t;
typedef const void *GenieProfile_Handle_t;
typedef const void *GenieProfileConfig_Handle_t;
typedef int GenieDialog_SentenceCode_t;
typedef int GenieDialog_Action_t;
typedef void (*GenieDialog_QueryCallback_t)(const char *response, const GenieDialog_SentenceCode_t code,
                                            const void *userData);
typedef void (*Genie_AllocCallback_t)(size_t size, const char **allocatedData);

#define GENIE_STATUS_SUCCESS 0
#define GENIE_STATUS_WARNING_ABORTED 1
#define GENIE_STATUS_WARNING_CONTEXT_EXCEEDED 4
#define GENIE_STATUS_ERROR_GENERAL (-1)
#define GENIE_STATUS_ERROR_INVALID_ARGUMENT (-2)
#define GENIE_STATUS_ERROR_QUERY_FAILED (-8)
enum { SENTENCE_COMPLETE, SENTENCE_BEGIN, SENTENCE_CONTINUE, SENTENCE_END, SENTENCE_ABORT };
enum { ACTION_ABORT = 1 };

#define MAX_EVENTS 256
typedef struct { int is_query; double start_us, dur_us, ttft_us, gen_us; long prompt_toks, gen_toks; } Event;
typedef struct { Event ev[MAX_EVENTS]; int n; } Profile;
typedef struct { long ctx, init_ms, token_ms, tokens, fail, creates_ok, created, max_num_tokens, ignore_limit, ignore_abort, fail_reset; char echo[512]; Profile *profile; } Config;
typedef struct { Config *cfg; long n_past; unsigned max_tokens; volatile int abort; } Dialog;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}
static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}
static long json_long(const char *json, const char *key, long dflt) {
  const char *s = strstr(json, key);
  if (!s || !(s = strchr(s + strlen(key), ':'))) return dflt;
  return atol(s + 1);
}
static void add_event(Profile *p, Event e) {
  if (p && p->n < MAX_EVENTS) p->ev[p->n++] = e;
}

uint32_t Genie_getApiMajorVersion(void) { return 1; }
uint32_t Genie_getApiMinorVersion(void) { return 17; }
uint32_t Genie_getApiPatchVersion(void) { return 0; }

Genie_Status_t GenieDialogConfig_createFromJson(const char *str, GenieDialogConfig_Handle_t *handle) {
  if (!str || !handle || !strstr(str, "\"dialog\"")) return GENIE_STATUS_ERROR_INVALID_ARGUMENT;
  Config *c = calloc(1, sizeof(Config));
  c->ctx = json_long(str, "\"size\"", 4096);
  c->init_ms = json_long(str, "\"fake-init-ms\"", 1500);
  c->token_ms = json_long(str, "\"fake-token-ms\"", 20);
  c->tokens = json_long(str, "\"fake-tokens\"", 12);
  c->fail = json_long(str, "\"fake-fail-create\"", 0);
  c->creates_ok = json_long(str, "\"fake-creates-ok\"", 0); /* creates that succeed before the rest fail */
  c->max_num_tokens = json_long(str, "\"max-num-tokens\"", 0);
  c->ignore_limit = json_long(str, "\"fake-ignore-limit\"", 0); /* as Genie 1.21's lade: no token limit */
  c->ignore_abort = json_long(str, "\"fake-ignore-abort\"", 0); /* ... and no ABORT either */
  c->fail_reset = json_long(str, "\"fake-fail-reset\"", 0);
  const char *e = strstr(str, "\"fake-echo-file\"");
  if (e && (e = strchr(e + 16, '"'))) {
    size_t n = 0;
    for (e++; *e && *e != '"' && n + 1 < sizeof c->echo; e++) c->echo[n++] = *e;
    c->echo[n] = 0;
  }
  *handle = c;
  return GENIE_STATUS_SUCCESS;
}

Genie_Status_t GenieDialogConfig_free(GenieDialogConfig_Handle_t h) {
  free((void *)h);
  return GENIE_STATUS_SUCCESS;
}

Genie_Status_t GenieProfile_create(GenieProfileConfig_Handle_t cfg, GenieProfile_Handle_t *h) {
  (void)cfg;
  if (!h) return GENIE_STATUS_ERROR_INVALID_ARGUMENT;
  if (getenv("FAKE_GENIE_NO_PROFILE")) return GENIE_STATUS_ERROR_GENERAL; /* a libGenie that cannot profile */
  *h = calloc(1, sizeof(Profile));
  return GENIE_STATUS_SUCCESS;
}

Genie_Status_t GenieDialogConfig_bindProfiler(GenieDialogConfig_Handle_t c, GenieProfile_Handle_t p) {
  if (!c || !p) return GENIE_STATUS_ERROR_INVALID_ARGUMENT;
  ((Config *)c)->profile = (Profile *)p;
  return GENIE_STATUS_SUCCESS;
}

Genie_Status_t GenieProfile_free(GenieProfile_Handle_t p) {
  free((void *)p);
  return GENIE_STATUS_SUCCESS;
}

Genie_Status_t GenieDialog_create(GenieDialogConfig_Handle_t c, GenieDialog_Handle_t *h) {
  if (!c || !h) return GENIE_STATUS_ERROR_INVALID_ARGUMENT;
  Config *cfg = (Config *)c;
  double t0 = now_us();
  sleep_ms(cfg->init_ms);
  if (cfg->fail || (cfg->creates_ok && ++cfg->created > cfg->creates_ok)) return GENIE_STATUS_ERROR_GENERAL;
  Dialog *d = calloc(1, sizeof(Dialog));
  d->cfg = (Config *)c;
  Event e = {0, t0, now_us() - t0, 0, 0, 0, 0};
  add_event(d->cfg->profile, e);
  *h = d;
  return GENIE_STATUS_SUCCESS;
}

Genie_Status_t GenieDialog_setMaxNumTokens(GenieDialog_Handle_t h, uint32_t n) {
  if (!h) return GENIE_STATUS_ERROR_INVALID_ARGUMENT;
  ((Dialog *)h)->max_tokens = n;
  return GENIE_STATUS_SUCCESS;
}

Genie_Status_t GenieDialog_signal(GenieDialog_Handle_t h, GenieDialog_Action_t a) {
  if (!h) return GENIE_STATUS_ERROR_INVALID_ARGUMENT;
  if (a == ACTION_ABORT) ((Dialog *)h)->abort = 1;
  return GENIE_STATUS_SUCCESS;
}

Genie_Status_t GenieDialog_reset(GenieDialog_Handle_t h) {
  if (!h) return GENIE_STATUS_ERROR_INVALID_ARGUMENT;
  if (((Dialog *)h)->cfg->fail_reset) return GENIE_STATUS_ERROR_GENERAL; /* as Dialog::reset throwing */
  ((Dialog *)h)->n_past = 0;
  return GENIE_STATUS_SUCCESS;
}

static const char *WORDS[] = {"the", "board", "answers", "quickly", "and", "every", "token", "arrives",
                              "on", "time", "with", "care"};

Genie_Status_t GenieDialog_query(GenieDialog_Handle_t h, const char *q, GenieDialog_SentenceCode_t code,
                                 GenieDialog_QueryCallback_t cb, const void *user) {
  (void)code;
  if (!h || !q || !cb) return GENIE_STATUS_ERROR_INVALID_ARGUMENT;
  Dialog *d = (Dialog *)h;
  d->abort = 0;
  double t0 = now_us();
  long prompt_toks = ((long)strlen(q) + 3) / 4 + (d->n_past ? 2 : 1); /* BOS; EOS+BOS on later turns */
  if (d->n_past + prompt_toks > d->cfg->ctx) return GENIE_STATUS_ERROR_QUERY_FAILED;
  d->n_past += prompt_toks;
  if (d->cfg->echo[0]) {
    FILE *f = fopen(d->cfg->echo, "ab");
    if (f) { fputs(q, f); fputc(0x1e, f); fclose(f); }
  }
  unsigned long hash = 1469598103934665603UL;
  for (const char *p = q; *p; p++) hash = (hash ^ (unsigned char)*p) * 1099511628211UL;
  long want = d->max_tokens ? (long)d->max_tokens : d->cfg->max_num_tokens > 0 ? d->cfg->max_num_tokens : d->cfg->tokens;
  if (d->cfg->ignore_limit) want = d->cfg->tokens;
  long pace = d->cfg->token_ms;
  sleep_ms(pace); /* prompt processing */
  double t_first = now_us();
  long n = 0;
  int aborted = 0;
  char buf[64];
  for (; n < want && d->n_past < d->cfg->ctx; n++) {
    if (d->abort && !d->cfg->ignore_abort) { aborted = 1; break; }
    if (n) sleep_ms(pace);
    snprintf(buf, sizeof buf, "%s%s", n ? " " : "", WORDS[(hash + (unsigned long)n * 7) % 12]);
    cb(buf, n == 0 ? SENTENCE_BEGIN : SENTENCE_CONTINUE, user);
    d->n_past++;
  }
  cb("", aborted ? SENTENCE_ABORT : SENTENCE_END, user);
  double t_end = now_us();
  Event e = {1, t0, t_end - t0, t_first - t0, t_end - t_first, prompt_toks, n};
  add_event(d->cfg->profile, e);
  if (aborted) return GENIE_STATUS_WARNING_ABORTED;
  return n < want ? GENIE_STATUS_WARNING_CONTEXT_EXCEEDED : GENIE_STATUS_SUCCESS;
}

Genie_Status_t GenieDialog_free(GenieDialog_Handle_t h) {
  free((void *)h);
  return GENIE_STATUS_SUCCESS;
}

Genie_Status_t GenieProfile_getJsonData(GenieProfile_Handle_t h, Genie_AllocCallback_t alloc, const char **out) {
  if (!h || !alloc || !out) return GENIE_STATUS_ERROR_INVALID_ARGUMENT;
  const Profile *p = (const Profile *)h;
  size_t cap = 512 + (size_t)p->n * 700;
  char *tmp = malloc(cap);
  size_t k = (size_t)snprintf(tmp, cap,
      "{\"header\":{\"header_version\":{\"major\":0,\"minor\":1,\"patch\":0},\"version\":{\"major\":0,"
      "\"minor\":1,\"patch\":0},\"artifact_type\":\"GENIE_PROFILE\"},\"metadata\":{\"timestamp\":%.0f},"
      "\"components\":[{\"name\":\"dialog0\",\"type\":\"dialog\",\"events\":[", now_us());
  for (int i = 0; i < p->n; i++) {
    const Event *e = &p->ev[i];
    if (!e->is_query) {
      k += (size_t)snprintf(tmp + k, cap - k,
          "%s{\"type\":\"GenieDialog_create\",\"duration\":%.0f,\"start\":%.0f,\"stop\":%.0f,"
          "\"init-time\":{\"value\":%.0f,\"unit\":\"us\"}}", i ? "," : "", e->dur_us, e->start_us,
          e->start_us + e->dur_us, e->dur_us);
    } else {
      double pr = e->ttft_us > 0 ? e->prompt_toks / (e->ttft_us / 1e6) : 0;
      double gr = e->gen_us > 0 ? e->gen_toks / (e->gen_us / 1e6) : 0;
      k += (size_t)snprintf(tmp + k, cap - k,
          "%s{\"type\":\"GenieDialog_query\",\"duration\":%.0f,\"start\":%.0f,\"stop\":%.0f,"
          "\"num-prompt-tokens\":{\"value\":%ld,\"unit\":\"\"},"
          "\"prompt-processing-rate\":{\"value\":%.4f,\"unit\":\"toks/sec\"},"
          "\"time-to-first-token\":{\"value\":%.0f,\"unit\":\"us\"},"
          "\"num-generated-tokens\":{\"value\":%ld,\"unit\":\"\"},"
          "\"token-generation-rate\":{\"value\":%.4f,\"unit\":\"toks/sec\"},"
          "\"token-generation-time\":{\"value\":%.0f,\"unit\":\"us\"}}",
          i ? "," : "", e->dur_us, e->start_us, e->start_us + e->dur_us, e->prompt_toks, pr, e->ttft_us,
          e->gen_toks, gr, e->gen_us);
    }
  }
  k += (size_t)snprintf(tmp + k, cap - k, "]}]}");
  const char *dst = NULL;
  alloc(k + 1, &dst);
  if (!dst) { free(tmp); return GENIE_STATUS_ERROR_GENERAL; }
  memcpy((char *)dst, tmp, k + 1);
  free(tmp);
  *out = dst;
  return GENIE_STATUS_SUCCESS;
}
