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

let abort = null;
process.on('SIGINT', () => {
  if (abort) abort();
});

function emit(obj) {
  fs.writeSync(3, JSON.stringify(obj) + '\n');
}

function describe(e) {
  if (e instanceof Error) {
    return { name: e.name, value: e.message, traceback: e.stack || '' };
  }
  return { name: 'Error', value: util.inspect(e), traceback: '' };
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
      emit({ type: 'result', is_main_result: true, text: typeof v === 'string' ? v : util.inspect(v) });
    }
  } catch (e) {
    emit({ type: 'error', ...describe(e) });
  } finally {
    abort = null;
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    process.stdout.write(MARK);
    process.stderr.write(MARK);
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
  chain = chain.then(() => run(req));
});
rl.on('close', () => {
  chain.then(() => process.exit(0));
});
