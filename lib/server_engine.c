/* server_engine.c - strata-serve's engine supervision.
 *
 * One thread per engine process.  It spawns `ENGINE --serve-stdio -m MODEL`,
 * reads its events (stdout) and log lines (stderr), hands it queued jobs one
 * at a time, forwards cancels, and kills it when it stays silent past the
 * watchdog.  When the process exits, the in-flight job fails with the exit
 * status and the last log lines, and the engine is restarted with
 * exponential back-off; the other engines keep serving meanwhile.
 */
#include "server_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chat.h"
#include "log.h"
#include "proto.h"

double srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- jobs ---- */

struct srv_job *srv_job_new(struct srv_model *m, cJSON *req, int is_generate)
{
    struct srv_job *j = calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->model = m;
    j->is_generate = is_generate;
    j->wake_fd = -1;
    pthread_mutex_lock(&m->srv->stat_mu);
    unsigned long seq = ++m->srv->job_seq;
    pthread_mutex_unlock(&m->srv->stat_mu);
    snprintf(j->id, sizeof(j->id), "r%lu", seq);
    cJSON_DeleteItemFromObject(req, "id");
    cJSON_AddStringToObject(req, "id", j->id);
    j->line = strata_proto_encode(req, &j->line_len);
    if (!j->line) {
        srv_job_unref(j);
        return NULL;
    }
    return j;
}

static void job_ref(struct srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void srv_job_unref(struct srv_job *j)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left)
        return;
    for (size_t i = 0; i < j->n_toks; i++) {
        free(j->toks[i].piece);
        free(j->toks[i].text);
        cJSON_Delete(j->toks[i].top);
    }
    free(j->toks);
    cJSON_Delete(j->done);
    free(j->line);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

static void wake_engine_fd(int fd)
{
    if (fd >= 0) {
        char c = 1;
        ssize_t n = write(fd, &c, 1);
        (void)n; /* a full pipe already means "wake up" */
    }
}

int srv_job_submit(struct srv_job *j, struct strata_err *err)
{
    struct srv_model *m = j->model;
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    int usable = 0;
    for (int i = 0; i < m->n_engines; i++)
        if (m->engines[i].state == SRV_ENGINE_READY)
            usable++;
    if (!usable) {
        int failed = 1;
        for (int i = 0; i < m->n_engines; i++)
            if (m->engines[i].state != SRV_ENGINE_FAILED)
                failed = 0;
        rc = strata_err_set(err, STRATA_E_UNSUPPORTED,
                            failed ? "the engine of model '%s' failed and is not running"
                                   : "model '%s' is loading; retry shortly",
                            m->id);
        goto out;
    }
    job_ref(j);
    j->t_enqueue = srv_now();
    j->next = NULL;
    if (m->q_tail)
        m->q_tail->next = j;
    else
        m->q_head = j;
    m->q_tail = j;
    m->q_len++;
    for (int i = 0; i < m->n_engines; i++)
        if (m->engines[i].state == SRV_ENGINE_READY && !m->engines[i].cur)
            wake_engine_fd(m->engines[i].wake[1]);
out:
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void srv_job_cancel(struct srv_job *j, int why)
{
    struct srv_model *m = j->model;
    int dequeued = 0;
    pthread_mutex_lock(&m->mu);
    for (struct srv_job **pp = &m->q_head; *pp; pp = &(*pp)->next) {
        if (*pp == j) {
            *pp = j->next;
            if (m->q_tail == j) {
                m->q_tail = NULL;
                for (struct srv_job *q = m->q_head; q; q = q->next)
                    m->q_tail = q;
            }
            m->q_len--;
            dequeued = 1;
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
    pthread_mutex_lock(&j->mu);
    if (!j->cancel)
        j->cancel = why;
    if (dequeued) {
        j->state = SRV_JOB_FAILED;
        j->err_status = 499;
        snprintf(j->err_msg, sizeof(j->err_msg), "request cancelled while queued");
        pthread_cond_broadcast(&j->cv);
    }
    int fd = j->state == SRV_JOB_RUNNING ? j->wake_fd : -1;
    pthread_mutex_unlock(&j->mu);
    wake_engine_fd(fd);
    if (dequeued)
        srv_job_unref(j); /* the queue's reference */
}

int srv_queue_len(struct srv *s)
{
    int n = 0;
    for (int i = 0; i < s->n_models; i++) {
        pthread_mutex_lock(&s->models[i].mu);
        n += s->models[i].q_len;
        pthread_mutex_unlock(&s->models[i].mu);
    }
    return n;
}

const char *srv_model_state(struct srv_model *m, int *n_ready, int *restarts)
{
    int ready = 0, failed = 0, restarting = 0, r = 0;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n_engines; i++) {
        int st = m->engines[i].state;
        ready += st == SRV_ENGINE_READY;
        failed += st == SRV_ENGINE_FAILED;
        restarting += st == SRV_ENGINE_RESTARTING || (st == SRV_ENGINE_STARTING &&
                                                      m->engines[i].ever_ready);
        r += m->engines[i].restarts;
    }
    pthread_mutex_unlock(&m->mu);
    if (n_ready)
        *n_ready = ready;
    if (restarts)
        *restarts = r;
    if (ready)
        return "ready";
    if (failed == m->n_engines)
        return "failed";
    return restarting ? "restarting" : "loading";
}

/* ---- one engine process ---- */

static void ring_add(struct srv_engine *e, const char *line)
{
    pthread_mutex_lock(&e->model->mu);
    free(e->log_ring[e->log_next]);
    e->log_ring[e->log_next] = strdup(line);
    e->log_next = (e->log_next + 1) % SRV_LOG_KEEP;
    pthread_mutex_unlock(&e->model->mu);
}

/* The last log lines, oldest first, joined with " | " (model mu held). */
static void ring_join(struct srv_engine *e, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (int k = 0; k < SRV_LOG_KEEP; k++) {
        const char *l = e->log_ring[(e->log_next + k) % SRV_LOG_KEEP];
        if (!l)
            continue;
        int w = snprintf(out + n, cap - n, "%s%s", n ? " | " : "", l);
        if (w < 0 || (size_t)w >= cap - n)
            break;
        n += (size_t)w;
    }
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int spawn_engine(struct srv_engine *e, int *in_fd, int *out_fd, int *err_fd,
                        struct strata_err *err)
{
    struct srv *s = e->model->srv;
    const struct strata_server_opts *o = s->o;
    int pin[2] = {-1, -1}, pout[2] = {-1, -1}, perr[2] = {-1, -1};
    int rc = 0;
    char ctx[32];
    const char **argv = calloc((size_t)o->n_engine_args + 8, sizeof(*argv));
    if (!argv)
        return strata_err_set(err, STRATA_E_NOMEM, "engine argv");
    int a = 0;
    argv[a++] = s->engine_path;
    argv[a++] = "--serve-stdio";
    argv[a++] = "-m";
    argv[a++] = e->model->path;
    if (o->n_ctx > 0) {
        snprintf(ctx, sizeof(ctx), "%d", o->n_ctx);
        argv[a++] = "--ctx";
        argv[a++] = ctx;
    }
    for (int i = 0; i < o->n_engine_args; i++)
        argv[a++] = o->engine_args[i];
    argv[a] = NULL;

    if (pipe2(pin, O_CLOEXEC) || pipe2(pout, O_CLOEXEC) || pipe2(perr, O_CLOEXEC)) {
        rc = strata_err_set(err, STRATA_E_IO, "engine pipes: %s", strerror(errno));
        goto out;
    }
    pid_t pid = fork();
    if (pid < 0) {
        rc = strata_err_set(err, STRATA_E_IO, "starting engine '%s': %s", s->engine_path,
                            strerror(errno));
        goto out;
    }
    if (pid == 0) {
        /* child: only async-signal-safe calls until exec */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pin[0], 0);
        dup2(pout[1], 1);
        dup2(perr[1], 2);
        signal(SIGPIPE, SIG_DFL);
        execvp(argv[0], (char *const *)argv);
        static const char msg[] = "cannot execute engine program\n";
        ssize_t w = write(2, msg, sizeof(msg) - 1);
        (void)w;
        _exit(127);
    }
    pthread_mutex_lock(&e->model->mu);
    e->pid = pid;
    pthread_mutex_unlock(&e->model->mu);
    close(pin[0]);
    close(pout[1]);
    close(perr[1]);
    pin[0] = pout[1] = perr[1] = -1;
    set_nonblock(pin[1]);
    set_nonblock(pout[0]);
    set_nonblock(perr[0]);
    *in_fd = pin[1];
    *out_fd = pout[0];
    *err_fd = perr[0];
    pin[1] = pout[0] = perr[0] = -1;
out:
    for (int i = 0; i < 2; i++) {
        if (pin[i] >= 0)
            close(pin[i]);
        if (pout[i] >= 0)
            close(pout[i]);
        if (perr[i] >= 0)
            close(perr[i]);
    }
    free(argv);
    return rc;
}

/* Fill a job's failure (job mu not held). */
static void job_fail(struct srv_job *j, int status, const char *type, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    if (j->state != SRV_JOB_DONE && j->state != SRV_JOB_FAILED) {
        j->state = SRV_JOB_FAILED;
        j->err_status = status;
        snprintf(j->err_type, sizeof(j->err_type), "%s", type);
        snprintf(j->err_msg, sizeof(j->err_msg), "%s", msg);
        j->t_end = srv_now();
        pthread_cond_broadcast(&j->cv);
    }
    j->wake_fd = -1;
    pthread_mutex_unlock(&j->mu);
}

static char *dup_str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return strdup(cJSON_IsString(v) ? v->valuestring : "");
}

static double num_or(const cJSON *o, const char *key, double d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : d;
}

static void on_ready(struct srv_engine *e, cJSON *ev, double t_spawn)
{
    struct srv_model *m = e->model;
    struct srv *s = m->srv;
    const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(ev, "chat_template");
    pthread_mutex_lock(&m->mu);
    if (!m->have_info) {
        m->have_info = 1;
        m->n_ctx = (int)num_or(ev, "n_ctx", 0);
        m->n_vocab = (int)num_or(ev, "n_vocab", 0);
        const char *t = s->chat_template;
        size_t tl = s->chat_template_len;
        if (!t && cJSON_IsString(tmpl) && tmpl->valuestring[0]) {
            t = tmpl->valuestring;
            tl = strlen(t);
        }
        if (t) {
            char *bos = dup_str(ev, "bos_token"), *eos = dup_str(ev, "eos_token");
            struct strata_err cerr = {0};
            if (strata_chat_create(&m->chat, t, tl, m->id, bos, eos, &cerr)) {
                snprintf(m->chat_error, sizeof(m->chat_error), "%.500s", cerr.msg);
                strata_log_warn("model '%s': chat template unusable: %s", m->id, cerr.msg);
                m->chat = NULL;
            } else {
                m->chat_format = (int)strata_chat_get_format(m->chat);
                strata_log_info("model '%s': chat template ready (tool-call format %s)", m->id,
                                strata_chat_format_name(strata_chat_get_format(m->chat)));
            }
            free(bos);
            free(eos);
        } else {
            snprintf(m->chat_error, sizeof(m->chat_error),
                     "model '%s' has no chat template (tokenizer.chat_template); "
                     "use /v1/completions or --chat-template", m->id);
        }
    }
    e->state = SRV_ENGINE_READY;
    e->ever_ready = 1;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    strata_log_info("model '%s' engine %d ready in %.1f s (n_ctx %d)", m->id, e->slot,
                    srv_now() - t_spawn, (int)num_or(ev, "n_ctx", 0));
}

static void log_done(struct srv_model *m, struct srv_job *j, const cJSON *ev)
{
    struct srv *s = m->srv;
    double n = num_or(ev, "n_gen", 0), np = num_or(ev, "n_prompt", 0);
    double nc = num_or(ev, "n_cached", 0);
    double t = (num_or(ev, "t_prefill_ms", 0) + num_or(ev, "t_decode_ms", 0)) / 1000.0;
    if (t <= 0)
        t = j->t_end - j->t_start;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(ev, "reason");
    const char *cancel = j->cancel == SRV_CANCEL_CLIENT ? "client" :
                         j->cancel == SRV_CANCEL_STOP ? "stop" : "no";
    double tps = t > 0 ? n / t : 0;
    strata_log_info("%s %s: done: %.0f tokens in %.2f s (%.1f tok/s) (%s, cancel=%s)", m->id,
                    j->id, n, t, tps, cJSON_IsString(r) ? r->valuestring : "?", cancel);
    pthread_mutex_lock(&s->stat_mu);
    s->n_gen_tokens += (unsigned long)n;
    s->n_prompt_tokens += (unsigned long)np;
    s->n_cached_tokens += (unsigned long)nc;
    s->gen_seconds += t;
    if (n >= 2)
        s->last_tps = tps;
    if (j->cancel == SRV_CANCEL_CLIENT)
        s->n_cancelled++;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(ev, "spec");
    if (cJSON_IsObject(sp)) {
        s->spec_steps += (unsigned long)num_or(sp, "steps", 0);
        s->spec_tokens += (unsigned long)num_or(sp, "tokens", 0);
        s->spec_drafted += (unsigned long)num_or(sp, "drafted", 0);
        s->spec_accepted += (unsigned long)num_or(sp, "accepted", 0);
        s->spec_ms += num_or(sp, "draft_ms", 0) + num_or(sp, "verify_ms", 0);
    }
    pthread_mutex_unlock(&s->stat_mu);
}

static const char *error_type_of(const char *code, int *status)
{
    if (code && (!strcmp(code, "invalid") || !strcmp(code, "limit") ||
                 !strcmp(code, "template"))) {
        *status = 400;
        return "invalid_request_error";
    }
    *status = 500;
    return "server_error";
}

/* One event line from the engine's stdout. */
static void on_event(struct srv_engine *e, const char *line, double t_spawn)
{
    struct srv_model *m = e->model;
    cJSON *ev = cJSON_Parse(line);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(ev, "type");
    if (!cJSON_IsString(type)) {
        strata_log_warn("%s engine %d: not a protocol event: %.200s", m->id, e->slot, line);
        ring_add(e, line);
        goto out;
    }
    const char *t = type->valuestring;
    if (!strcmp(t, "ready")) {
        on_ready(e, ev, t_spawn);
        goto out;
    }
    if (!strcmp(t, "log")) {
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ev, "msg");
        const char *txt = cJSON_IsString(msg) ? msg->valuestring : "";
        strata_log_info("%s engine %d: %s", m->id, e->slot, txt);
        ring_add(e, txt);
        goto out;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(ev, "id");
    pthread_mutex_lock(&m->mu);
    struct srv_job *j = e->cur;
    if (j && !(cJSON_IsString(id) && !strcmp(id->valuestring, j->id)))
        j = NULL;
    pthread_mutex_unlock(&m->mu);
    if (!j) {
        if (!strcmp(t, "error")) {
            const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ev, "msg");
            const char *txt = cJSON_IsString(msg) ? msg->valuestring : line;
            strata_log_warn("%s engine %d: error: %s", m->id, e->slot, txt);
            ring_add(e, txt);
        }
        goto out; /* late events of a finished job */
    }
    if (!strcmp(t, "token")) {
        pthread_mutex_lock(&j->mu);
        if (j->n_toks == j->cap_toks) {
            size_t cap = j->cap_toks ? j->cap_toks * 2 : 64;
            struct srv_tok *nt = realloc(j->toks, cap * sizeof(*nt));
            if (!nt) {
                pthread_mutex_unlock(&j->mu);
                goto out;
            }
            j->toks = nt;
            j->cap_toks = cap;
        }
        struct srv_tok *tk = &j->toks[j->n_toks];
        tk->id = (int32_t)num_or(ev, "tok", -1);
        tk->piece = dup_str(ev, "piece");
        tk->text = dup_str(ev, "text");
        tk->logprob = num_or(ev, "logprob", 0);
        tk->top = cJSON_DetachItemFromObjectCaseSensitive(ev, "top");
        j->n_toks++;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
    } else if (!strcmp(t, "done") || !strcmp(t, "error")) {
        pthread_mutex_lock(&m->mu);
        e->cur = NULL;
        pthread_mutex_unlock(&m->mu);
        if (!strcmp(t, "done")) {
            pthread_mutex_lock(&j->mu);
            j->done = ev;
            ev = NULL;
            j->state = SRV_JOB_DONE;
            j->t_end = srv_now();
            j->wake_fd = -1;
            pthread_cond_broadcast(&j->cv);
            pthread_mutex_unlock(&j->mu);
            if (j->is_generate)
                log_done(m, j, j->done);
        } else {
            const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ev, "msg");
            const cJSON *code = cJSON_GetObjectItemCaseSensitive(ev, "code");
            int status;
            const char *ty = error_type_of(cJSON_IsString(code) ? code->valuestring : NULL,
                                           &status);
            const char *txt = cJSON_IsString(msg) ? msg->valuestring : "engine error";
            strata_log_info("%s %s: failed: %s", m->id, j->id, txt);
            job_fail(j, status, ty, txt);
        }
        srv_job_unref(j); /* the engine's reference */
        /* wake ourselves to pick up the next queued job */
        wake_engine_fd(e->wake[1]);
    }
out:
    cJSON_Delete(ev);
}

static void describe_status(int status, char *out, size_t cap)
{
    if (WIFEXITED(status))
        snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, cap, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(out, cap, "ended (wait status %d)", status);
}

struct outq {
    char *buf;
    size_t len, cap;
};

static void outq_add(struct outq *q, const char *s, size_t n)
{
    if (q->len + n > q->cap) {
        size_t cap = q->cap ? q->cap : 4096;
        while (cap < q->len + n)
            cap *= 2;
        char *nb = realloc(q->buf, cap);
        if (!nb)
            return;
        q->buf = nb;
        q->cap = cap;
    }
    memcpy(q->buf + q->len, s, n);
    q->len += n;
}

/* Run one engine process until it exits.  Returns with it reaped; fills
 * status_text with how it ended. */
static int run_engine(struct srv_engine *e, int in_fd, int out_fd, int err_fd,
                      char *status_text, size_t cap)
{
    struct srv_model *m = e->model;
    struct srv *s = m->srv;
    const struct strata_server_opts *o = s->o;
    struct strata_proto_reader rout, rerr;
    struct outq q = {0};
    strata_proto_reader_init(&rout, out_fd);
    strata_proto_reader_init(&rerr, err_fd);
    double t_spawn = srv_now(), last = t_spawn, shutdown_at = 0, progress_at = t_spawn;
    int cancel_sent = 0, shutdown_sent = 0, killed = 0;
    struct srv_job *sent_for = NULL;
    char why[256] = "";

    while (out_fd >= 0 || err_fd >= 0) {
        /* hand out work and cancels */
        pthread_mutex_lock(&m->mu);
        if (e->state == SRV_ENGINE_READY && !e->cur && m->q_head && !s->stopping) {
            struct srv_job *j = m->q_head;
            m->q_head = j->next;
            if (!m->q_head)
                m->q_tail = NULL;
            m->q_len--;
            e->cur = j; /* the queue's reference becomes the engine's */
            pthread_mutex_lock(&j->mu);
            j->state = SRV_JOB_RUNNING;
            j->t_start = srv_now();
            j->wake_fd = e->wake[1];
            pthread_mutex_unlock(&j->mu);
            outq_add(&q, j->line, j->line_len);
            cancel_sent = 0;
            sent_for = j;
            last = srv_now();
        }
        struct srv_job *cur = e->cur;
        pthread_mutex_unlock(&m->mu);
        if (cur && cur == sent_for && !cancel_sent) {
            pthread_mutex_lock(&cur->mu);
            int c = cur->cancel;
            pthread_mutex_unlock(&cur->mu);
            if (c) {
                char line[128];
                int n = snprintf(line, sizeof(line), "{\"type\":\"cancel\",\"id\":\"%s\"}\n",
                                 cur->id);
                outq_add(&q, line, (size_t)n);
                cancel_sent = 1;
            }
        }
        if (s->stopping && !shutdown_sent) {
            static const char sd[] = "{\"type\":\"shutdown\"}\n";
            outq_add(&q, sd, sizeof(sd) - 1);
            shutdown_sent = 1;
            shutdown_at = srv_now();
        }

        struct pollfd p[4];
        int np = 0, i_out = -1, i_err = -1, i_in = -1;
        if (out_fd >= 0) {
            i_out = np;
            p[np++] = (struct pollfd){.fd = out_fd, .events = POLLIN};
        }
        if (err_fd >= 0) {
            i_err = np;
            p[np++] = (struct pollfd){.fd = err_fd, .events = POLLIN};
        }
        if (in_fd >= 0 && q.len) {
            i_in = np;
            p[np++] = (struct pollfd){.fd = in_fd, .events = POLLOUT};
        }
        int i_wake = np;
        p[np++] = (struct pollfd){.fd = e->wake[0], .events = POLLIN};
        int pr = poll(p, (nfds_t)np, 200);
        if (pr < 0 && errno != EINTR)
            break;
        double now = srv_now();
        if (pr > 0 && (p[i_wake].revents & POLLIN)) {
            char buf[64];
            while (read(e->wake[0], buf, sizeof(buf)) > 0) {
            }
        }
        if (i_in >= 0 && (p[i_in].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t w = write(in_fd, q.buf, q.len);
            if (w > 0) {
                memmove(q.buf, q.buf + w, q.len - (size_t)w);
                q.len -= (size_t)w;
            } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                close(in_fd); /* EPIPE: the engine is gone; its exit follows */
                in_fd = -1;
                q.len = 0;
            }
        }
        if (i_err >= 0 && (p[i_err].revents & (POLLIN | POLLHUP | POLLERR))) {
            struct strata_err rerr_e = {0};
            int r = strata_proto_reader_fill(&rerr, &rerr_e);
            char *l;
            while ((l = strata_proto_reader_line(&rerr))) {
                if (l[0]) {
                    strata_log_info("%s engine %d: %s", m->id, e->slot, l);
                    ring_add(e, l);
                }
                free(l);
                last = now;
            }
            if (r == 0 || r == -2) {
                close(err_fd);
                err_fd = -1;
            }
        }
        if (i_out >= 0 && (p[i_out].revents & (POLLIN | POLLHUP | POLLERR))) {
            struct strata_err rout_e = {0};
            int r = strata_proto_reader_fill(&rout, &rout_e);
            char *l;
            while ((l = strata_proto_reader_line(&rout))) {
                if (l[0])
                    on_event(e, l, t_spawn);
                free(l);
                last = now;
            }
            if (r == -2) {
                strata_log_warn("%s engine %d: %s", m->id, e->slot, rout_e.msg);
                kill(e->pid, SIGKILL);
            }
            if (r == 0 || r == -2) {
                close(out_fd);
                out_fd = -1;
            }
        }
        /* watchdogs */
        pthread_mutex_lock(&m->mu);
        int busy = e->cur != NULL, starting = e->state == SRV_ENGINE_STARTING;
        pthread_mutex_unlock(&m->mu);
        if (starting && now - progress_at >= 5.0) {
            strata_log_info("model '%s' engine %d: still loading (%.0f s)", m->id, e->slot,
                            now - t_spawn);
            progress_at = now;
        }
        double limit = starting ? o->load_timeout_s : o->watchdog_s;
        if (!killed && (busy || starting) && now - last > limit) {
            snprintf(why, sizeof(why), "silent for %.0f s (watchdog)", now - last);
            strata_log_error("%s engine %d: %s; killing it", m->id, e->slot, why);
            kill(e->pid, SIGKILL);
            killed = 1;
        }
        if (!killed && shutdown_sent && now - shutdown_at > 3.0) {
            kill(e->pid, SIGKILL);
            killed = 1;
        }
        if (!killed && out_fd < 0 && err_fd >= 0 && now - last > 2.0) {
            kill(e->pid, SIGKILL); /* stdout closed but the process lingers */
            killed = 1;
        }
    }
    if (in_fd >= 0)
        close(in_fd);
    if (out_fd >= 0)
        close(out_fd);
    if (err_fd >= 0)
        close(err_fd);
    int status = 0;
    double t0 = srv_now();
    while (waitpid(e->pid, &status, WNOHANG) == 0) {
        if (srv_now() - t0 > 2.0 && !killed) {
            kill(e->pid, SIGKILL);
            killed = 1;
        }
        usleep(10000);
    }
    pthread_mutex_lock(&m->mu);
    e->pid = 0;
    pthread_mutex_unlock(&m->mu);
    describe_status(status, status_text, cap);
    if (why[0]) {
        size_t n = strlen(status_text);
        snprintf(status_text + n, cap - n, " after being %s", why);
    }
    strata_proto_reader_free(&rout);
    strata_proto_reader_free(&rerr);
    free(q.buf);
    return status;
}

static void *engine_thread(void *arg)
{
    struct srv_engine *e = arg;
    struct srv_model *m = e->model;
    struct srv *s = m->srv;
    double backoff = 0.25;
    while (!s->stopping) {
        int in_fd = -1, out_fd = -1, err_fd = -1;
        struct strata_err err = {0};
        pthread_mutex_lock(&m->mu);
        e->state = SRV_ENGINE_STARTING;
        pthread_mutex_unlock(&m->mu);
        double t0 = srv_now();
        char status[512] = "";
        int wstatus = -1;
        if (spawn_engine(e, &in_fd, &out_fd, &err_fd, &err)) {
            snprintf(status, sizeof(status), "could not start: %.480s", err.msg);
        } else {
            strata_log_info("model '%s' engine %d: started %s (pid %d)", m->id, e->slot,
                            s->engine_path, (int)e->pid);
            wstatus = run_engine(e, in_fd, out_fd, err_fd, status, sizeof(status));
        }
        char lines[2048];
        pthread_mutex_lock(&m->mu);
        struct srv_job *cur = e->cur;
        e->cur = NULL;
        ring_join(e, lines, sizeof(lines));
        int first = !e->ever_ready;
        e->state = s->stopping ? SRV_ENGINE_STOPPED
                   : first     ? SRV_ENGINE_FAILED
                               : SRV_ENGINE_RESTARTING;
        if (first)
            e->fail_exit = wstatus >= 0 && WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
        if (first)
            snprintf(e->fail_msg, sizeof(e->fail_msg),
                     "engine for model '%s' %s before it was ready; last log lines: %s",
                     m->id, status, lines[0] ? lines : "(none)");
        pthread_cond_broadcast(&m->cv);
        pthread_mutex_unlock(&m->mu);
        if (cur) {
            char msg[3000];
            snprintf(msg, sizeof(msg),
                     "the engine for model '%s' %s during this request; last log lines: %s",
                     m->id, status, lines[0] ? lines : "(none)");
            strata_log_error("%s %s: failed: %s", m->id, cur->id, msg);
            job_fail(cur, 500, "server_error", msg);
            srv_job_unref(cur);
        }
        if (s->stopping)
            break;
        if (first) {
            strata_log_error("%s", e->fail_msg);
            break;
        }
        strata_log_error("model '%s' engine %d %s; restarting in %.2f s (last log lines: %s)",
                         m->id, e->slot, status, backoff, lines[0] ? lines : "(none)");
        pthread_mutex_lock(&m->mu);
        e->restarts++;
        pthread_mutex_unlock(&m->mu);
        pthread_mutex_lock(&s->stat_mu);
        s->n_restarts++;
        pthread_mutex_unlock(&s->stat_mu);
        for (double w = 0; w < backoff && !s->stopping; w += 0.05)
            usleep(50000);
        backoff = srv_now() - t0 > 60 ? 0.25 : (backoff * 2 > 8 ? 8 : backoff * 2);
    }
    /* fail whatever is still queued once no engine of the model is left */
    pthread_mutex_lock(&m->mu);
    int alive = 0;
    for (int i = 0; i < m->n_engines; i++)
        if (m->engines[i].state == SRV_ENGINE_READY || m->engines[i].state ==
            SRV_ENGINE_STARTING || m->engines[i].state == SRV_ENGINE_RESTARTING)
            alive++;
    struct srv_job *q = alive ? NULL : m->q_head;
    if (!alive) {
        m->q_head = m->q_tail = NULL;
        m->q_len = 0;
    }
    pthread_mutex_unlock(&m->mu);
    while (q) {
        struct srv_job *next = q->next;
        job_fail(q, 503, "server_error", "the model's engine is not running");
        srv_job_unref(q);
        q = next;
    }
    return NULL;
}

int srv_engines_start(struct srv *s, struct strata_err *err)
{
    for (int i = 0; i < s->n_models; i++) {
        struct srv_model *m = &s->models[i];
        for (int k = 0; k < m->n_engines; k++) {
            struct srv_engine *e = &m->engines[k];
            if (pipe2(e->wake, O_CLOEXEC | O_NONBLOCK))
                return strata_err_set(err, STRATA_E_IO, "wake pipe: %s", strerror(errno));
            if (pthread_create(&e->thread, NULL, engine_thread, e))
                return strata_err_set(err, STRATA_E_IO, "engine thread for model '%s'",
                                      m->id);
            e->thread_started = 1;
        }
    }
    return 0;
}

int srv_engines_wait_ready(struct srv *s, volatile sig_atomic_t *stop, struct strata_err *err)
{
    for (int i = 0; i < s->n_models; i++) {
        struct srv_model *m = &s->models[i];
        pthread_mutex_lock(&m->mu);
        for (;;) {
            int ready = 0, failed = -1;
            for (int k = 0; k < m->n_engines; k++) {
                ready += m->engines[k].state == SRV_ENGINE_READY;
                if (m->engines[k].state == SRV_ENGINE_FAILED)
                    failed = k;
            }
            if (failed >= 0) {
                /* the engine's exit status says what kind of failure it was */
                int x = m->engines[failed].fail_exit;
                int code = x == 2 ? STRATA_E_INVALID : x == 3 ? STRATA_E_FORMAT
                           : x == 4 ? STRATA_E_GPU : x == 5 ? STRATA_E_NOMEM : STRATA_E_IO;
                strata_err_set(err, code, "%s", m->engines[failed].fail_msg);
                pthread_mutex_unlock(&m->mu);
                return code;
            }
            if (ready == m->n_engines)
                break;
            if (stop && *stop) {
                pthread_mutex_unlock(&m->mu);
                return strata_err_set(err, STRATA_E_CANCELLED, "stopped while loading");
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&m->cv, &m->mu, &ts);
        }
        pthread_mutex_unlock(&m->mu);
    }
    return 0;
}

void srv_engines_stop(struct srv *s)
{
    s->stopping = 1;
    for (int i = 0; i < s->n_models; i++)
        for (int k = 0; k < s->models[i].n_engines; k++)
            wake_engine_fd(s->models[i].engines[k].wake[1]);
    for (int i = 0; i < s->n_models; i++) {
        struct srv_model *m = &s->models[i];
        for (int k = 0; k < m->n_engines; k++) {
            struct srv_engine *e = &m->engines[k];
            if (e->thread_started)
                pthread_join(e->thread, NULL);
            e->thread_started = 0;
            for (int r = 0; r < SRV_LOG_KEEP; r++) {
                free(e->log_ring[r]);
                e->log_ring[r] = NULL;
            }
        }
    }
}
