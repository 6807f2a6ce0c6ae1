// The JavaScript driver of forkbox-agent's code interpreter (package
// interp), run as `node -e DRIVER MARK` in a context's directory.
//
// Each line on stdin is a cell: {"code", "env"}. The code runs in this
// process's global context (vm.runInThisContext), so globals and top-level
// declarations stay between cells. A cell whose code uses top-level await
// runs as an async arrow function: an expression's value is the result;
// statements are the function's body (their declarations are then its
// own). The value of the last expression is the main result; a thrown
// value is the error. Results, errors and the end line go to descriptor
// 3 as JSON lines; what the cell prints goes to stdout and stderr, which
// the cell's end marks with MARK (pipes are written synchronously on
// Linux, so the marker follows everything printed before it).
'use strict';
const fs = require('fs');
const util = require('util');
const vm = require('vm');
const readline = require('readline');

const MARK = process.argv[1];
globalThis.require = require;

// The driver's own tools, taken before any cell runs: cells share this
// realm and may replace the globals they come from.
const writeSync = fs.writeSync.bind(fs);
const stringify = JSON.stringify;
const outWrite = process.stdout.write.bind(process.stdout);
const errWrite = process.stderr.write.bind(process.stderr);
const inspect = util.inspect;

let abort = null;
process.on('SIGINT', () => {
  if (abort) abort();
});

function emit(obj) {
  let line;
  try {
    line = stringify(obj);
  } catch (e) {
    line = stringify({ type: 'error', name: 'Error', value: 'the result cannot be sent: ' + safeString(e), traceback: '' });
  }
  writeSync(3, line + '\n');
}

function safeString(v) {
  try {
    return typeof v === 'string' ? v : inspect(v);
  } catch {
    return '(a value that cannot be shown)';
  }
}

function describe(e) {
  try {
    if (e instanceof Error) {
      return { name: safeString(e.name), value: safeString(e.message), traceback: safeString(e.stack || '') };
    }
  } catch {}
  return { name: 'Error', value: safeString(e), traceback: '' };
}

function compile(code) {
  try {
    return new vm.Script(code, { filename: 'cell.js' });
  } catch (e) {
    if (e instanceof SyntaxError && /await is only valid/.test(e.message)) {
      try {
        return new vm.Script('(async () => (\n' + code + '\n))()', { filename: 'cell.js' });
      } catch {
        return new vm.Script('(async () => {\n' + code + '\n})()', { filename: 'cell.js' });
      }
    }
    throw e;
  }
}

async function run(req) {
  const saved = {};
  for (const [k, v] of Object.entries(req.env || {})) {
    saved[k] = process.env[k];
    process.env[k] = v;
  }
  try {
    let v = compile(req.code || '').runInThisContext({ breakOnSigint: true });
    if (v !== null && typeof v === 'object' && typeof v.then === 'function') {
      v = await new Promise((resolve, reject) => {
        abort = () => reject(new Error('Interrupted'));
        v.then(resolve, reject);
      });
    }
    if (v !== undefined) {
      emit({ type: 'result', is_main_result: true, text: safeString(v) });
    }
  } catch (e) {
    emit({ type: 'error', ...describe(e) });
  } finally {
    abort = null;
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    try {
      outWrite(MARK);
      errWrite(MARK);
    } catch {}
    emit({ type: 'end', rc: 0 });
  }
}

let chain = Promise.resolve();
const rl = readline.createInterface({ input: process.stdin, terminal: false });
rl.on('line', (line) => {
  let req;
  try {
    req = JSON.parse(line);
  } catch {
    return;
  }
  chain = chain.then(() => run(req)).catch(() => {});
});
rl.on('close', () => {
  chain.then(() => process.exit(0));
});
