/* The AdmissionReview's body read once before it is parsed (webhook._envelope, built with the compiled
 * policy core: setup.py).
 *
 * trim(body, limit) -> (objects, body'): one pass over the JSON text that
 *   - counts its objects (an upper bound: see below), stopping as soon as there are more than ``limit``;
 *   - cuts the member "managedFields" out of request.object.metadata and request.oldObject.metadata.
 *     kube-apiserver sends every object with the field managers' record of which manager set which field
 *     (a fifth to a quarter of a pod's review); no rule reads it, and parsing it into Python objects and
 *     freeing them costs more than all the rules of a pod together.
 *
 * The pass follows the JSON grammar (strings and their escapes, objects, arrays, members, commas) on the
 * path to the members it cuts (the review, its request, the objects, their metadata) and in those members,
 * so that a cut is always a whole member of the object at that path, whatever a string holds: a string that
 * looks like structure is read as a string. Any other value it follows by its strings and brackets only, to
 * where it ends (its commas, colons and literals stay for orjson to read). Once past the last metadata a
 * member may be cut from (request.oldObject's; request.object's when the request's operation is CREATE: it
 * has no old object), the rest is only counted, every "{" (strings' too: a bound), and left as it is.
 * What it does not check, orjson does on what is left (numbers, literals, escapes, UTF-8); in a member cut,
 * which nobody else reads, it takes only what is plainly valid JSON (string_end's plain, cut_scalar), so that a
 * body orjson would refuse is refused all the same. It answers objects = -1, and the body unchanged, for a text it
 * does not read as one JSON value, or nested past orjson's 1024 levels: the caller then parses the body as
 * it is, and orjson says what is wrong. A member it does not recognise (a key spelt with escapes, one past
 * the point it stops at, one past its table of cuts) is left in: keeping it only costs its parse.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define MAX_DEPTH 1024 /* orjson's: deeper, the caller's path says so */
#define MAX_CUTS 16

enum { VALUE, VALUE_OR_END, KEY, KEY_OR_END, COLON, COMMA_OR_END, DONE };
/* what an object is, on the path to the members cut */
enum { OTHER, TOP, REQUEST, OBJECT, OLD_OBJECT, METADATA, OLD_METADATA, OPERATION };

/* the characters that open or close a string, an object or an array */
static const unsigned char SPECIAL[256] = {['"'] = 1, ['{'] = 1, ['}'] = 1, ['['] = 1, [']'] = 1};

/* The index of the quote that ends the string whose opening quote is at ``start``; -1 if none. With
 * ``plain`` (a string in a member cut), -1 also for anything but what is plainly valid JSON: characters
 * from " " on, ASCII, and the escapes of one character. Nobody reads a member cut, so nobody else would
 * refuse it: this refuses whatever orjson might (a control character, an odd escape, bytes that are not
 * UTF-8), and more (any other non-ASCII text, \u escapes), which is then parsed as sent. */
static inline Py_ssize_t
string_end(const unsigned char *s, Py_ssize_t start, Py_ssize_t n, int plain)
{
    Py_ssize_t j = start + 1;
    for (;;) {
#if defined(__SSE2__)
        const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(' ');
        while (j + 16 <= n) {
            __m128i chunk = _mm_loadu_si128((const __m128i *)(s + j));
            __m128i stop = _mm_or_si128(_mm_cmpeq_epi8(chunk, quote), _mm_cmpeq_epi8(chunk, backslash));
            if (plain) /* (signed: a byte from 0x80 on is below " " too) */
                stop = _mm_or_si128(stop, _mm_cmplt_epi8(chunk, space));
            int mask = _mm_movemask_epi8(stop);
            if (mask) {
                j += __builtin_ctz(mask);
                goto found;
            }
            j += 16;
        }
#endif
        while (j < n && s[j] != '"' && s[j] != '\\' && (!plain || (s[j] >= ' ' && s[j] < 0x80)))
            j++;
        if (j >= n)
            return -1;
#if defined(__SSE2__)
    found:
#endif
        if (s[j] == '"')
            return j;
        if (plain && (s[j] != '\\' || j + 1 >= n || s[j + 1] == 0 || !strchr("\"\\/bfnrt", s[j + 1])))
            return -1;
        j += 2; /* an escape: the next character is not the string's end */
        if (j > n)
            return -1;
    }
}

/* Whether s[start:end], a number or a literal in a member cut, is plainly valid JSON: true, false, null,
 * or -?(0|[1-9][0-9]*)(.[0-9]+)? of at most 17 characters (as string_end's plain: anything else is parsed). */
static int
cut_scalar(const unsigned char *s, Py_ssize_t start, Py_ssize_t end)
{
    Py_ssize_t size = end - start, k = start;
    if ((size == 4 && (memcmp(s + start, "true", 4) == 0 || memcmp(s + start, "null", 4) == 0)) ||
        (size == 5 && memcmp(s + start, "false", 5) == 0))
        return 1;
    if (size > 17)
        return 0;
    if (s[k] == '-')
        k++;
    if (k >= end || s[k] < '0' || s[k] > '9' || (s[k] == '0' && k + 1 < end && s[k + 1] >= '0' && s[k + 1] <= '9'))
        return 0;
    while (k < end && s[k] >= '0' && s[k] <= '9')
        k++;
    if (k < end && s[k] == '.') {
        k++;
        if (k >= end || s[k] < '0' || s[k] > '9')
            return 0;
        while (k < end && s[k] >= '0' && s[k] <= '9')
            k++;
    }
    return k == end;
}

#define BLANK(c) ((c) == ' ' || (c) == '\n' || (c) == '\r' || (c) == '\t')

/* the characters of a number or a literal */
static const unsigned char SCALAR[256] = {
    ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1,
    ['-'] = 1, ['+'] = 1, ['.'] = 1,
    ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1, ['i'] = 1, ['j'] = 1,
    ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1,
    ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1, ['y'] = 1, ['z'] = 1,
    ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1, ['I'] = 1, ['J'] = 1,
    ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1,
    ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1,
};

/* The end (the index after it) of the value of a member cut, which begins at s[i]: the JSON grammar followed
 * through it, its strings, numbers and literals only as plainly valid (string_end's plain, cut_scalar), its
 * objects counted into *objects. -1 when it is not such a value, or nests past MAX_DEPTH (``depth``
 * levels open around it); -2 as soon as *objects is past ``limit``. The general loop of trim reads the same,
 * token by token through its states; this is the same grammar as a few tight loops (a member cut is most of
 * what trim follows token by token: kube-apiserver's record of field managers, a tree of short keys). */
static Py_ssize_t
plain_value(const unsigned char *s, Py_ssize_t i, Py_ssize_t n, int depth, Py_ssize_t *objects, Py_ssize_t limit)
{
    unsigned char open[MAX_DEPTH]; /* '{' or '[' per container open in the value */
    int top = 0;
    for (;;) {
        /* a value */
        while (i < n && BLANK(s[i]))
            i++;
        if (i >= n)
            return -1;
        unsigned char c = s[i];
        if (c == '{' || c == '[') {
            if (depth + top >= MAX_DEPTH)
                return -1;
            if (c == '{' && ++*objects > limit)
                return -2;
            open[top++] = c;
            i++;
            while (i < n && BLANK(s[i]))
                i++;
            if (i >= n)
                return -1;
            if (s[i] == (c == '{' ? '}' : ']')) { /* empty */
                top--;
                i++;
            } else if (c == '[') {
                continue; /* its first value */
            } else {
                goto key;
            }
        } else if (c == '"') {
            Py_ssize_t end = string_end(s, i, n, 1);
            if (end < 0)
                return -1;
            i = end + 1;
        } else {
            Py_ssize_t start = i;
            while (i < n && SCALAR[s[i]])
                i++;
            if (i == start || !cut_scalar(s, start, i))
                return -1;
        }
        /* after a value: the containers it closes, then a comma or the end */
        for (;;) {
            if (top == 0)
                return i;
            while (i < n && BLANK(s[i]))
                i++;
            if (i >= n)
                return -1;
            c = s[i];
            if (c == ',') {
                i++;
                if (open[top - 1] == '[')
                    break; /* the next value */
                goto key;
            }
            if (c != (open[top - 1] == '{' ? '}' : ']'))
                return -1;
            top--;
            i++;
        }
        continue;
    key:
        /* a key and its colon; its value next */
        while (i < n && BLANK(s[i]))
            i++;
        if (i >= n || s[i] != '"')
            return -1;
        {
            Py_ssize_t end = string_end(s, i, n, 1);
            if (end < 0)
                return -1;
            i = end + 1;
        }
        while (i < n && BLANK(s[i]))
            i++;
        if (i >= n || s[i] != ':')
            return -1;
        i++;
    }
}

static int
is_key(const unsigned char *s, Py_ssize_t start, Py_ssize_t end, const char *key, Py_ssize_t size)
{
    return end - start - 1 == size && memcmp(s + start + 1, key, (size_t)size) == 0;
}

static PyObject *
answer(Py_ssize_t objects, PyObject *body)
{
    PyObject *count = PyLong_FromSsize_t(objects);
    if (count == NULL)
        return NULL;
    Py_INCREF(body);
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) {
        Py_DECREF(count);
        Py_DECREF(body);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, count);
    PyTuple_SET_ITEM(pair, 1, body);
    return pair;
}

static PyObject *
trim(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_CheckExact(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "trim(body: bytes, limit: int)");
        return NULL;
    }
    PyObject *body = args[0];
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(body);
    Py_ssize_t n = PyBytes_GET_SIZE(body);

    unsigned char kind[MAX_DEPTH]; /* '{' or '[' per open container */
    unsigned char tag[MAX_DEPTH];  /* what each open object is on the path */
    int depth = 0, state = VALUE, child = OTHER, create = 0;
    Py_ssize_t objects = 0, i = 0, comma = -1;
    Py_ssize_t counted_from = -1; /* where the part only counted begins (-1: the body read to its end) */
    /* the cuts: [start, end) each; a member first in its object takes the comma after it */
    Py_ssize_t cut_start[MAX_CUTS], cut_end[MAX_CUTS];
    int cuts = 0, open_cut = 0, open_depth = -1, comma_after = 0, first_member = 0;

    while (i < n) {
        unsigned char c = s[i];
        if (BLANK(c)) {
            i++;
            continue;
        }
        int value_done = 0;
        if (open_cut && state == VALUE) {
            /* the value of the member cut, read whole */
            Py_ssize_t end = plain_value(s, i, n, depth, &objects, limit);
            if (end == -2)
                return answer(objects, body);
            if (end < 0)
                return answer(-1, body);
            i = end;
            value_done = 1;
        } else switch (c) {
        case '"': {
            Py_ssize_t end = string_end(s, i, n, 0);
            if (end < 0)
                return answer(-1, body);
            if (state == KEY || state == KEY_OR_END) {
                int in = tag[depth - 1];
                child = OTHER;
                if (in == TOP && is_key(s, i, end, "request", 7))
                    child = REQUEST;
                else if (in == REQUEST && is_key(s, i, end, "object", 6))
                    child = OBJECT;
                else if (in == REQUEST && is_key(s, i, end, "oldObject", 9))
                    child = OLD_OBJECT;
                else if (in == REQUEST && is_key(s, i, end, "operation", 9))
                    child = OPERATION;
                else if ((in == OBJECT || in == OLD_OBJECT) && is_key(s, i, end, "metadata", 8))
                    child = in == OBJECT ? METADATA : OLD_METADATA;
                else if ((in == METADATA || in == OLD_METADATA) && cuts < MAX_CUTS && is_key(s, i, end, "managedFields", 13)) {
                    /* after a comma: from the comma; first in its object: from the key, to the comma after */
                    first_member = state == KEY_OR_END;
                    cut_start[cuts] = first_member ? i : comma;
                    if (cuts > 0 && cut_start[cuts] < cut_end[cuts - 1]) {
                        /* the comma before it went with the member cut before it: now first in its object */
                        cut_start[cuts] = cut_end[cuts - 1];
                        first_member = 1;
                    }
                    open_cut = 1;
                    open_depth = depth;
                }
                state = COLON;
            } else if (state == VALUE || state == VALUE_OR_END) {
                if (child == OPERATION)
                    create = is_key(s, i, end, "CREATE", 6);
                value_done = 1;
            } else {
                return answer(-1, body);
            }
            i = end + 1;
            break;
        }
        case '{':
        case '[':
            if (state != VALUE && state != VALUE_OR_END)
                return answer(-1, body);
            if (depth >= MAX_DEPTH)
                return answer(-1, body);
            if (depth > 0 && child == OTHER) {
                /* off the path and not cut: its strings and brackets followed to its end, its objects
                 * counted; its commas, colons and literals are orjson's to read (they stay) */
                int base = depth;
                for (;;) {
                    while (i < n && !SPECIAL[s[i]])
                        i++;
                    if (i >= n)
                        return answer(-1, body);
                    c = s[i];
                    if (c == '"') {
                        Py_ssize_t end = string_end(s, i, n, 0);
                        if (end < 0)
                            return answer(-1, body);
                        i = end + 1;
                    } else if (c == '{' || c == '[') {
                        if (depth >= MAX_DEPTH)
                            return answer(-1, body);
                        if (c == '{' && ++objects > limit)
                            return answer(objects, body);
                        kind[depth++] = c;
                        i++;
                    } else {
                        if (kind[depth - 1] != (c == '}' ? '{' : '['))
                            return answer(-1, body);
                        depth--;
                        i++;
                        if (depth == base)
                            break;
                    }
                }
                value_done = 1;
                break;
            }
            if (c == '{') {
                if (++objects > limit)
                    return answer(objects, body);
                tag[depth] = depth == 0 ? TOP : kind[depth - 1] == '{' ? child : OTHER;
                state = KEY_OR_END;
            } else {
                tag[depth] = OTHER;
                state = VALUE_OR_END;
            }
            child = OTHER; /* (an array's values have no key) */
            kind[depth++] = c;
            i++;
            break;
        case '}':
        case ']':
            if (depth == 0 || kind[depth - 1] != (c == '}' ? '{' : '['))
                return answer(-1, body);
            if (state != COMMA_OR_END && state != (c == '}' ? KEY_OR_END : VALUE_OR_END))
                return answer(-1, body);
            if (comma_after && depth == open_depth)
                comma_after = 0; /* the member cut was the object's only one: "{}" stays */
            if (tag[depth - 1] == OLD_METADATA || (tag[depth - 1] == METADATA && create)) {
                counted_from = i; /* nothing after it is cut: the rest only counted */
                break;
            }
            depth--;
            i++;
            value_done = 1;
            break;
        case ':':
            if (state != COLON)
                return answer(-1, body);
            state = VALUE;
            i++;
            break;
        case ',':
            if (state != COMMA_OR_END)
                return answer(-1, body);
            if (comma_after && depth == open_depth) {
                cut_end[cuts - 1] = i + 1;
                comma_after = 0;
            }
            comma = i;
            state = kind[depth - 1] == '{' ? KEY : VALUE;
            i++;
            break;
        default:
            /* a number or a literal: its characters; orjson reads what they say */
            if (state != VALUE && state != VALUE_OR_END)
                return answer(-1, body);
            {
                Py_ssize_t start = i;
                while (i < n && SCALAR[s[i]])
                    i++;
                if (i == start)
                    return answer(-1, body);
            }
            value_done = 1;
        }
        if (value_done) {
            if (depth == 0) {
                state = DONE;
                /* the rest may only be blank */
                while (i < n && BLANK(s[i]))
                    i++;
                if (i < n)
                    return answer(-1, body);
                break;
            }
            state = COMMA_OR_END;
            if (open_cut && depth == open_depth) {
                cut_end[cuts++] = i;
                open_cut = 0;
                comma_after = first_member;
            }
        }
        if (counted_from >= 0)
            break;
    }
    if (counted_from >= 0) {
        /* the rest is left as it is, for orjson to read; its "{" counted, strings' included (a bound) */
        for (const unsigned char *p = s + counted_from, *e = s + n; (p = memchr(p, '{', (size_t)(e - p))) != NULL; p++)
            if (++objects > limit)
                return answer(objects, body);
    } else if (state != DONE) {
        return answer(-1, body);
    }
    if (cuts == 0)
        return answer(objects, body);

    Py_ssize_t removed = 0;
    for (int k = 0; k < cuts; k++)
        removed += cut_end[k] - cut_start[k];
    PyObject *kept = PyBytes_FromStringAndSize(NULL, n - removed);
    if (kept == NULL)
        return NULL;
    char *out = PyBytes_AS_STRING(kept);
    Py_ssize_t from = 0;
    for (int k = 0; k < cuts; k++) {
        memcpy(out, s + from, (size_t)(cut_start[k] - from));
        out += cut_start[k] - from;
        from = cut_end[k];
    }
    memcpy(out, s + from, (size_t)(n - from));
    PyObject *pair = answer(objects, kept);
    Py_DECREF(kept);
    return pair;
}

static PyMethodDef methods[] = {
    {"trim", (PyCFunction)(void (*)(void))trim, METH_FASTCALL,
     "trim(body, limit) -> (objects, body): the review's objects counted (-1: not read, the body as it is), "
     "request.object's and request.oldObject's metadata.managedFields cut out"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "webhook._envelope", "An AdmissionReview's body read once before it is parsed.", -1, methods,
};

PyMODINIT_FUNC
PyInit__envelope(void)
{
    return PyModule_Create(&module);
}
