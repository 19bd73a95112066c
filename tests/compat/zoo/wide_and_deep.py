# WDL, written the way DeepRec's model zoo writes its training scripts (modelzoo/wide_and_deep/train.py):
# the same flags, input pipeline, feature columns, tf.layers, DeepRec-style session config with
# do_smart_stage, staged(next_element), MonitoredTrainingSession for training and
# ChiefSessionCreator + MonitoredSession for evaluation. Sizes are small so a test runs it in seconds.
# The only line a DeepRec user changes is the import below.

import argparse
import collections
import math
import os
import sys

from smartstage.compat import tf  # DeepRec: import tensorflow as tf
from tensorflow.python.ops import partitioned_variables

CONTINUOUS_COLUMNS = ['I' + str(i) for i in range(1, 14)]
CATEGORICAL_COLUMNS = ['C' + str(i) for i in range(1, 27)]
LABEL_COLUMN = ['clicked']
TRAIN_DATA_COLUMNS = LABEL_COLUMN + CONTINUOUS_COLUMNS + CATEGORICAL_COLUMNS
FEATURE_COLUMNS = CONTINUOUS_COLUMNS + CATEGORICAL_COLUMNS
HASH_BUCKET_SIZE = 500
EMBEDDING_DIMENSION = 8

args = None  # the parsed flags, global as in the model zoo
RESULTS = {}  # what the test reads: training losses, eval ACC and AUC, the checkpoint directory


class WDL():
    def __init__(self, wide_column, deep_column, dnn_hidden_units=(32, 16), optimizer_type='adam',
                 linear_learning_rate=0.2, deep_learning_rate=0.01, inputs=None, bf16=False, stock_tf=None,
                 input_layer_partitioner=None, dense_layer_partitioner=None):
        self._feature = inputs[0]
        self._label = inputs[1]
        self._wide_column = wide_column
        self._deep_column = deep_column
        self.tf = stock_tf
        self.bf16 = False if self.tf else bf16
        self.is_training = True
        self._dnn_hidden_units = dnn_hidden_units
        self._linear_learning_rate = linear_learning_rate
        self._deep_learning_rate = deep_learning_rate
        self._optimizer_type = optimizer_type
        self._input_layer_partitioner = input_layer_partitioner
        self._dense_layer_partitioner = dense_layer_partitioner
        self._create_model()
        with tf.name_scope('head'):
            self._create_loss()
            self._create_optimizer()
            self._create_metrics()

    def _add_layer_summary(self, value, tag):
        tf.summary.scalar('%s/fraction_of_zero_values' % tag, tf.nn.zero_fraction(value))
        tf.summary.histogram('%s/activation' % tag, value)

    def _dnn(self, dnn_input, dnn_hidden_units, layer_name):
        for layer_id, num_hidden_units in enumerate(dnn_hidden_units):
            with tf.variable_scope(layer_name + '_%d' % layer_id, partitioner=self._dense_layer_partitioner,
                                   reuse=tf.AUTO_REUSE) as dnn_layer_scope:
                dnn_input = tf.layers.dense(dnn_input, units=num_hidden_units, activation=tf.nn.relu,
                                            kernel_initializer=tf.glorot_uniform_initializer(), name=dnn_layer_scope)
                self._add_layer_summary(dnn_input, dnn_layer_scope.name)
        return dnn_input

    def _create_model(self):
        with tf.variable_scope('dnn'):
            with tf.variable_scope('input_from_feature_columns', partitioner=self._input_layer_partitioner,
                                   reuse=tf.AUTO_REUSE):
                net = tf.feature_column.input_layer(features=self._feature, feature_columns=self._deep_column)
                self._add_layer_summary(net, 'input_from_feature_columns')
            dnn_scope = tf.variable_scope('dnn_layers', partitioner=self._dense_layer_partitioner,
                                          reuse=tf.AUTO_REUSE)
            with dnn_scope.keep_weights(dtype=tf.float32) if self.bf16 else dnn_scope:
                net = self._dnn(net, self._dnn_hidden_units, 'hiddenlayer')
                with tf.variable_scope('logits') as dnn_logits_scope:
                    dnn_logits = tf.layers.dense(net, units=1, activation=None, name=dnn_logits_scope)
                    self._add_layer_summary(dnn_logits, dnn_logits_scope.name)
        with tf.variable_scope('linear', partitioner=self._dense_layer_partitioner) as scope:
            if self.tf or not args.emb_fusion:
                linear_logits = tf.feature_column.linear_model(units=1, features=self._feature,
                                                               feature_columns=self._wide_column,
                                                               sparse_combiner='sum', weight_collections=None,
                                                               trainable=True)
            else:
                '''Embedding Fusion Feature: DeepRec's linear_model takes do_fusion too'''
                linear_logits = tf.feature_column.linear_model(units=1, features=self._feature,
                                                               feature_columns=self._wide_column,
                                                               sparse_combiner='sum', weight_collections=None,
                                                               trainable=True, do_fusion=args.emb_fusion)
            self._add_layer_summary(linear_logits, scope.name)
        self._logits = tf.add_n([dnn_logits, linear_logits])
        self.probability = tf.math.sigmoid(self._logits)
        self.output = tf.round(self.probability)

    def _create_loss(self):
        self._logits = tf.squeeze(self._logits)
        self.loss = tf.losses.sigmoid_cross_entropy(self._label, self._logits, scope='loss',
                                                    reduction=tf.losses.Reduction.SUM_OVER_BATCH_SIZE)
        tf.summary.scalar('loss', self.loss)

    def _create_optimizer(self):
        self.global_step = tf.train.get_or_create_global_step()
        if self.tf or self._optimizer_type == 'adam':
            dnn_optimizer = tf.train.AdamOptimizer(learning_rate=self._deep_learning_rate, beta1=0.9, beta2=0.999,
                                                   epsilon=1e-8)
        elif self._optimizer_type == 'adagrad':
            dnn_optimizer = tf.train.AdagradOptimizer(learning_rate=self._deep_learning_rate,
                                                      initial_accumulator_value=0.1)
        elif self._optimizer_type == 'adamasync':
            dnn_optimizer = tf.train.AdamAsyncOptimizer(learning_rate=self._deep_learning_rate, beta1=0.9,
                                                        beta2=0.999, epsilon=1e-8)
        else:
            dnn_optimizer = tf.train.AdagradDecayOptimizer(learning_rate=self._deep_learning_rate,
                                                           global_step=self.global_step)
        linear_optimizer = tf.train.FtrlOptimizer(learning_rate=self._linear_learning_rate,
                                                  l1_regularization_strength=0.0, l2_regularization_strength=0.0)
        train_ops = []
        update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
        with tf.control_dependencies(update_ops):
            train_ops.append(dnn_optimizer.minimize(
                self.loss, var_list=tf.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES, scope='dnn'),
                global_step=self.global_step))
            train_ops.append(linear_optimizer.minimize(
                self.loss, var_list=tf.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES, scope='linear')))
            self.train_op = tf.group(*train_ops)

    def _create_metrics(self):
        self.acc, self.acc_op = tf.metrics.accuracy(labels=self._label, predictions=self.output)
        self.auc, self.auc_op = tf.metrics.auc(labels=self._label, predictions=self.probability,
                                               num_thresholds=1000)
        tf.summary.scalar('eval_acc', self.acc)
        tf.summary.scalar('eval_auc', self.auc)


def build_model_input(filename, batch_size, num_epochs):
    def parse_csv(value):
        cont_defaults = [[0.0] for i in range(1, 14)]
        cate_defaults = [[' '] for i in range(1, 27)]
        label_defaults = [[0]]
        columns = tf.io.decode_csv(value, record_defaults=label_defaults + cont_defaults + cate_defaults)
        all_columns = collections.OrderedDict(zip(TRAIN_DATA_COLUMNS, columns))
        labels = all_columns.pop(LABEL_COLUMN[0])
        return all_columns, labels

    if args.workqueue and not args.tf:
        from tensorflow.python.ops.work_queue import WorkQueue
        files = WorkQueue([filename]).input_dataset()
    else:
        files = filename
    if args.parquet_dataset and not args.tf:
        from tensorflow.python.data.experimental.ops import parquet_dataset_ops
        dataset = parquet_dataset_ops.ParquetDataset(files, batch_size=batch_size)
    else:
        dataset = tf.data.TextLineDataset(files)
        dataset = dataset.shuffle(buffer_size=20000, seed=args.seed)
        dataset = dataset.repeat(num_epochs)
        dataset = dataset.batch(batch_size)
        dataset = dataset.map(parse_csv, num_parallel_calls=2)
    return dataset.prefetch(2)


def build_categorical_column(column_name):
    categorical_column = tf.feature_column.categorical_column_with_hash_bucket(
        column_name, hash_bucket_size=HASH_BUCKET_SIZE, dtype=tf.string)
    if not args.tf:
        if args.ev_elimination == 'gstep':
            evict_opt = tf.GlobalStepEvict(steps_to_live=4000)
        elif args.ev_elimination == 'l2':
            evict_opt = tf.L2WeightEvict(l2_weight_threshold=1.0)
        else:
            evict_opt = None
        filter_option = tf.CounterFilter(filter_freq=3) if args.ev_filter == 'counter' else None
        ev_opt = tf.EmbeddingVariableOption(evict_option=evict_opt, filter_option=filter_option)
        if args.ev:
            categorical_column = tf.feature_column.categorical_column_with_embedding(
                column_name, dtype=tf.string, ev_option=ev_opt)
    return categorical_column


def build_embedding_column(categorical_column):
    if args.tf or not args.emb_fusion:
        return tf.feature_column.embedding_column(categorical_column, dimension=EMBEDDING_DIMENSION, combiner='mean')
    return tf.feature_column.embedding_column(categorical_column, dimension=EMBEDDING_DIMENSION, combiner='mean',
                                              do_fusion=args.emb_fusion)


def build_feature_columns():
    mins_list = [0.0, -3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    range_list = [1539.0, 22069.0, 65535.0, 561.0, 2655388.0, 233523.0, 26297.0, 5106.0, 24376.0, 9.0, 181.0,
                  1807.0, 6879.0]

    def make_minmaxscaler(min, range):
        def minmaxscaler(col):
            return (col - min) / range
        return minmaxscaler

    wide_columns = []
    deep_columns = []
    for column_name in FEATURE_COLUMNS:
        if column_name in CATEGORICAL_COLUMNS:
            wide_columns.append(tf.feature_column.categorical_column_with_hash_bucket(
                column_name, hash_bucket_size=HASH_BUCKET_SIZE, dtype=tf.string))
            deep_columns.append(build_embedding_column(build_categorical_column(column_name)))
        else:
            col_index = CONTINUOUS_COLUMNS.index(column_name)
            normalizer_fn = make_minmaxscaler(mins_list[col_index], range_list[col_index])
            column = tf.feature_column.numeric_column(column_name, normalizer_fn=normalizer_fn, shape=(1, ))
            wide_columns.append(column)
            deep_columns.append(column)
    return wide_columns, deep_columns


def train(sess_config, input_hooks, model, data_init_op, steps, checkpoint_dir):
    model.is_training = True
    hooks = list(input_hooks)
    scaffold = tf.train.Scaffold(local_init_op=tf.group(tf.local_variables_initializer(), data_init_op),
                                 saver=tf.train.Saver(max_to_keep=args.keep_checkpoint_max))
    hooks.append(tf.train.StopAtStepHook(last_step=steps))
    hooks.append(tf.train.LoggingTensorHook({'steps': model.global_step, 'loss': model.loss}, every_n_iter=100))
    losses = RESULTS.setdefault('losses', [])
    with tf.train.MonitoredTrainingSession(
            master='', is_chief=True, hooks=hooks, scaffold=scaffold, checkpoint_dir=checkpoint_dir,
            save_checkpoint_steps=args.save_steps or steps, summary_dir=checkpoint_dir,
            save_summaries_steps=args.save_steps, config=sess_config) as sess:
        while not sess.should_stop():
            loss, _ = sess.run([model.loss, model.train_op])
            losses.append(loss)
    print("Training completed.")


def eval(sess_config, input_hooks, model, data_init_op, steps, checkpoint_dir):
    model.is_training = False
    hooks = list(input_hooks)
    scaffold = tf.train.Scaffold(local_init_op=tf.group(tf.local_variables_initializer(), data_init_op))
    session_creator = tf.train.ChiefSessionCreator(scaffold=scaffold, checkpoint_dir=checkpoint_dir,
                                                   config=sess_config)
    writer = tf.summary.FileWriter(os.path.join(checkpoint_dir, 'eval'))
    merged = tf.summary.merge_all()
    with tf.train.MonitoredSession(session_creator=session_creator, hooks=hooks) as sess:
        for _in in range(1, steps + 1):
            if _in != steps:
                sess.run([model.acc_op, model.auc_op])
            else:
                eval_acc, eval_auc, events = sess.run([model.acc_op, model.auc_op, merged])
                writer.add_summary(events, _in)
                print("ACC = {}\nAUC = {}".format(eval_acc, eval_auc))
                RESULTS.update(acc=eval_acc, auc=eval_auc)
    writer.close()


def main():
    train_file = os.path.join(args.data_location, 'train.csv')
    test_file = os.path.join(args.data_location, 'eval.csv')
    if (not os.path.exists(train_file)) or (not os.path.exists(test_file)):
        print("Dataset does not exist in the given data_location.")
        sys.exit()
    no_of_training_examples = sum(1 for line in open(train_file))
    no_of_test_examples = sum(1 for line in open(test_file))
    batch_size = args.batch_size
    if args.steps == 0:
        no_of_epochs = 1
        train_steps = math.ceil(float(no_of_training_examples) / batch_size)
    else:
        no_of_epochs = math.ceil((float(batch_size) * args.steps) / no_of_training_examples)
        train_steps = args.steps
    test_steps = math.ceil(float(no_of_test_examples) / batch_size)

    tf.set_random_seed(args.seed)
    checkpoint_dir = args.checkpoint if args.checkpoint else os.path.join(args.output_dir, 'model_WDL')
    RESULTS['checkpoint_dir'] = checkpoint_dir

    train_dataset = build_model_input(train_file, batch_size, no_of_epochs)
    test_dataset = build_model_input(test_file, batch_size, 1)
    iterator = tf.data.Iterator.from_structure(tf.data.get_output_types(train_dataset),
                                               tf.data.get_output_shapes(test_dataset))
    next_element = iterator.get_next()
    train_init_op = iterator.make_initializer(train_dataset)
    test_init_op = iterator.make_initializer(test_dataset)

    wide_column, deep_column = build_feature_columns()
    input_layer_partitioner = partitioned_variables.min_max_variable_partitioner(
        max_partitions=0, min_slice_size=args.input_layer_partitioner << 20) if args.input_layer_partitioner else None
    dense_layer_partitioner = partitioned_variables.min_max_variable_partitioner(
        max_partitions=0, min_slice_size=args.dense_layer_partitioner << 10) if args.dense_layer_partitioner else None

    sess_config = tf.ConfigProto()
    sess_config.inter_op_parallelism_threads = args.inter
    sess_config.intra_op_parallelism_threads = args.intra
    hooks = []
    if args.smartstaged and not args.tf:
        next_element = tf.staged(next_element, num_threads=args.stage_threads, capacity=40)
        sess_config.graph_options.optimizer_options.do_smart_stage = args.do_smart_stage
        hooks.append(tf.make_prefetch_hook())
    if args.op_fusion and not args.tf:
        sess_config.graph_options.optimizer_options.do_op_fusion = True
    if args.micro_batch and not args.tf:
        sess_config.graph_options.optimizer_options.micro_batch_num = args.micro_batch

    model = WDL(wide_column=wide_column, deep_column=deep_column, linear_learning_rate=args.linear_learning_rate,
                deep_learning_rate=args.deep_learning_rate, optimizer_type=args.optimizer, bf16=args.bf16,
                stock_tf=args.tf, inputs=next_element, input_layer_partitioner=input_layer_partitioner,
                dense_layer_partitioner=dense_layer_partitioner)
    RESULTS['model'] = model
    if args.export_meta:
        tf.train.export_meta_graph(args.export_meta)
    train(sess_config, hooks, model, train_init_op, train_steps, checkpoint_dir)
    if not args.no_eval:
        eval(sess_config, hooks, model, test_init_op, test_steps, checkpoint_dir)


def boolean_string(string):
    low_string = string.lower()
    if low_string not in {'false', 'true'}:
        raise ValueError('Not a valid boolean string')
    return low_string == 'true'


def get_arg_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument('--data_location', default='./data')
    parser.add_argument('--steps', type=int, default=0)
    parser.add_argument('--batch_size', type=int, default=512)
    parser.add_argument('--output_dir', default='./result')
    parser.add_argument('--checkpoint')
    parser.add_argument('--seed', type=int, default=2021)
    parser.add_argument('--optimizer', type=str, default='adamasync',
                        choices=['adam', 'adamasync', 'adagraddecay', 'adagrad', 'gradientdescent'])
    parser.add_argument('--linear_learning_rate', type=float, default=0.2)
    parser.add_argument('--deep_learning_rate', type=float, default=0.01)
    parser.add_argument('--save_steps', type=int, default=0)
    parser.add_argument('--keep_checkpoint_max', type=int, default=1)
    parser.add_argument('--bf16', action='store_true')
    parser.add_argument('--no_eval', action='store_true')
    parser.add_argument('--inter', type=int, default=0)
    parser.add_argument('--intra', type=int, default=0)
    parser.add_argument('--input_layer_partitioner', type=int, default=8)
    parser.add_argument('--dense_layer_partitioner', type=int, default=16)
    parser.add_argument('--tf', action='store_true')
    parser.add_argument('--smartstaged', type=boolean_string, default=True)
    parser.add_argument('--stage_threads', type=int, default=4)  # the model zoo hard-codes num_threads=4
    # False: the same staged graph without the rewrite, the run SmartStage must reproduce exactly.
    parser.add_argument('--do_smart_stage', type=boolean_string, default=True)
    parser.add_argument('--emb_fusion', type=boolean_string, default=True)
    parser.add_argument('--ev', type=boolean_string, default=False)
    parser.add_argument('--ev_elimination', type=str, choices=[None, 'l2', 'gstep'], default=None)
    parser.add_argument('--ev_filter', type=str, choices=[None, 'counter'], default=None)
    parser.add_argument('--op_fusion', type=boolean_string, default=True)
    parser.add_argument('--micro_batch', type=int, default=0)
    parser.add_argument('--workqueue', type=boolean_string, default=False)
    parser.add_argument('--parquet_dataset', type=boolean_string, default=True)
    parser.add_argument('--export_meta', help='write the built graph here before training (for smartstage verify)')
    return parser


if __name__ == '__main__':
    args = get_arg_parser().parse_args()
    main()
