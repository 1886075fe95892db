#!/usr/bin/env escript
%% Writes the reference vectors of exchange.rs's tests: for each routing key in FILE (one a
%% line), erlang:phash2 of the key as a binary, and the bucket the consistent-hash
%% exchange (rabbitmq_consistent_hash_exchange, 3.8 and later) picks among each N buckets.
%% Usage: escript exchange_vectors.escript FILE 2 3 8 128 4096
main([File | Ns]) ->
    {ok, B} = file:read_file(File),
    Keys = [K || K <- binary:split(B, <<"\n">>, [global]), K =/= <<>>],
    lists:foreach(fun(K) ->
        Bs = [integer_to_list(bucket(erlang:phash2(K), list_to_integer(N))) || N <- Ns],
        io:format("~s ~b ~b ~s~n", [K, erlang:phash2(K), erlang:phash2(K, 1 bsl 32),
                                    string:join(Bs, " ")])
    end, Keys).

%% The exchange's jump consistent hash of an integer key.
bucket(_Key, 1) -> 0;
bucket(Key, N) -> jump(-1, 0, N, rand:seed_s(exs1024, {Key, Key, Key})).

jump(B, J, N, _) when J >= N -> B;
jump(_, J, N, S0) ->
    {R, S} = rand:uniform_s(S0),
    jump(J, trunc((J + 1) / R), N, S).
