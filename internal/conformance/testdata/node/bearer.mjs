// Preloaded (node --import ./bearer.mjs) into the conformance suite when it
// runs through mcpgate: the suite's server mode has no option to send
// headers, and mcpgate refuses a call without a bearer token. This adds
// "Authorization: Bearer $MCPGATE_CONFORMANCE_TOKEN" to every HTTP request
// the process sends, and changes nothing else: the SDK client's fetch and
// the undici requests of the dns-rebinding scenario both go through undici's
// global dispatcher, which Node's own fetch uses as well.
//
// Without MCPGATE_CONFORMANCE_TOKEN in the environment it does nothing.
import { Agent, setGlobalDispatcher } from 'undici';

const token = process.env.MCPGATE_CONFORMANCE_TOKEN;

// withAuthorization returns headers (in any of the shapes undici dispatches:
// null, an object, a flat [name, value, ...] array or an iterable of pairs)
// with an Authorization header added, unless one is already there.
function withAuthorization(headers, value) {
  if (headers == null) {
    return { authorization: value };
  }
  if (Array.isArray(headers) || typeof headers[Symbol.iterator] === 'function') {
    const flat = [];
    for (const entry of headers) {
      if (Array.isArray(entry)) {
        flat.push(entry[0], entry[1]);
      } else {
        flat.push(entry);
      }
    }
    for (let i = 0; i < flat.length; i += 2) {
      if (String(flat[i]).toLowerCase() === 'authorization') {
        return flat;
      }
    }
    return [...flat, 'authorization', value];
  }
  for (const name of Object.keys(headers)) {
    if (name.toLowerCase() === 'authorization') {
      return headers;
    }
  }
  return { ...headers, authorization: value };
}

if (token) {
  const value = `Bearer ${token}`;
  const bearer = (dispatch) => (opts, handler) =>
    dispatch({ ...opts, headers: withAuthorization(opts.headers, value) }, handler);
  setGlobalDispatcher(new Agent().compose(bearer));
}
